"""What a run costs on the device it is meant for: memory and time per stage (estimate.py, DeepSpeed's own
model-state estimators plus our activation and bucket terms) on the device and peak it is priced on
(target.py). `roformer plan` and `roformer pretrain --dry-run` print it; gpu-check compares it with a real run.
"""
