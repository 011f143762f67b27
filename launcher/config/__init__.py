"""What a run is: the run config (YAML -> typed sections), its schedule, the batch arithmetic of every
stage at a world size, the DeepSpeed JSON the engine starts with, and `roformer plan`.

Imports nothing from launcher.train, launcher.launch or launcher.downstream (checked by import-linter).
"""
