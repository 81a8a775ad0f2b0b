"""What the monitor tick exports: metrics, the step-time history and the post-window check."""
