"""One rank of pretraining: the per-rank entry (`python -m launcher.train.rank_entry`), the training
loop, the checkpointer, the engine and RNG helpers, and rank-0 metrics.

Never imports launcher.downstream (checked by import-linter): stage-end evals reach the trainer as a
callback, which starts the eval job as a separate process."""
