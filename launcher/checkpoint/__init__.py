"""A run's checkpoints, the whole lifecycle in one place; no other package calls DeepSpeed's
save_checkpoint / load_checkpoint or scans checkpoints/.

catalogue.py (what is on disk), checkpointer.py (save and load, all ranks), resume.py (where a start comes
from), universal.py (universal checkpoints for every ZeRO stage), weights.py (read-only views: export,
averaging, evaluation). Above launcher.run_dir, below launcher.train (import-linter); catalogue.py and
weights.py import no torch at module level, for the report and `roformer export --help`.
"""
