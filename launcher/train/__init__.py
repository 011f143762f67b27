"""One rank of pretraining: the per-rank entry (`python -m launcher.train.rank_entry`), the training
loop, the engine and rank-0 metrics (its checkpoints: launcher.checkpoint).

Never imports launcher.downstream (checked by import-linter): stage-end evals reach the trainer as a
callback, which starts the eval job as a separate process."""
