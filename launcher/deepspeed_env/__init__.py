"""DeepSpeed's facts, in one package: its JIT op cache, its import without the parts a rank never runs, the
optimizer section it will build, whether a node's torch wheel and FusedAdam fit its GPUs (node_check.py), the
process group, and how a built engine stands (engine_state.py: loss scale, its floor, seeding). The engine's build
is launcher/train/engine.py; a run's DeepSpeed JSON is parsed in launcher/config/deepspeed_json.py."""
