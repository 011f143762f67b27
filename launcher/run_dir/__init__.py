"""What a run directory holds on disk and how it is read: its layout, record files, checkpoint files
and sidecar, rank heartbeats, and the step convention of metrics.jsonl."""
