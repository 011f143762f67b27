"""Where a command may write: the one output rule (launcher/outputs/output_paths.py)."""
