"""What a run directory holds on disk and how it is read: its layout (paths), the lock, record files, rank
heartbeats, and the step convention of metrics.jsonl (its checkpoints: launcher.checkpoint)."""
