"""The checks of a run's inputs beyond its config file, before anything starts: the prepared data (both splits, the
tokenizer, the mixtures, the corpus size per stage), init_from's tokenizer and a branch's source (run_checks.py
check_run, check_data). What they check is the run as resolved (launcher/resolved/: the init_from directory as read,
the stages, every stage's DeepSpeed config with DeepSpeed's verdict and the accelerator's precision).

Used by the launch plan, `roformer plan` and every rank; launcher.config only parses, and the rank's builder
(launcher/train/rank.py) creates the data streams these checks looked at.
"""
