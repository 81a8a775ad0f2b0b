"""The typed records of every boundary: HTTP bodies, actor messages, the manifest and analysis summary on disk.

No re-exports: import each model from its module, so a training worker that needs
the agent protocol does not load the analysis summary.
"""
