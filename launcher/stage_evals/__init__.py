"""Stage-end evaluations (`logging.stage_end_evals`), in one place: which evals exist and checking a list of
them (specs.py), starting a checkpoint's evals beside training (start.py, called by rank 0's stage-end
callback), and the detached job that exports the checkpoint and runs them (job.py).

The job is reached only as a separate process (`python -m launcher.stage_evals.job`), so neither the launch
side nor the trainer imports the fine-tuning code (checked by import-linter).
"""
