"""A run's inputs beyond its config file, read and checked before anything starts: the init_from model
directory, the prepared data, DeepSpeed's verdict on every stage's JSON and the accelerator's precision.

Used by the launch plan, `roformer plan` and every rank; launcher.config only parses, and the rank's builder
(launcher/train/rank.py) creates the data streams these checks looked at.
"""
