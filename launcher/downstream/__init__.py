"""What is done with an export: `roformer eval-mlm`, `roformer finetune` on the labelled tasks and the
retrieval task. The export itself is launcher.export; the stage-end eval job is launcher.stage_evals."""
