"""The DeepSpeed a process runs with: its JIT op cache, its import without the parts a rank never runs, and the optimizer section it will build."""
