"""What is done with a trained checkpoint: `roformer export` (+ model card), reading an export,
`roformer eval-mlm`, `roformer finetune` on the labelled tasks, and the stage-end eval job."""
