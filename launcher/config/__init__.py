"""What a run is, parsed and validated only: the run config (YAML -> typed sections), its schedule, the batch
arithmetic of every stage at a world size, the DeepSpeed JSON the engine starts with.

Reads the config file and the schedule and DeepSpeed JSON files it names: an init_from directory, the data and
DeepSpeed's verdict are read by launcher.inputs, another run's checkpoint by the checkpoint component. Imports neither torch, DeepSpeed, the data
streams, nor launcher.train, launcher.launch or launcher.downstream (checked by import-linter).
"""
