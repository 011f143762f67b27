"""RoFormer-DS launcher: the `roformer` command line and everything that drives DeepSpeed."""
