"""Detection that acts: every rank's stacks, stalls and lag, watches, OOM watches."""
