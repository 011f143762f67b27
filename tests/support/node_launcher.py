"""DeepSpeed's per-node launcher (`python -m deepspeed.launcher.launch`) as the tests start it: its own
`main`, imported without MLflow (1.5 s at each start; launcher/launch/deepspeed_runner.py does the same
for the runner that `roformer pretrain` starts)."""
from launcher.lean_imports import unimportable

with unimportable("mlflow"):
    from deepspeed.launcher import launch

if __name__ == "__main__":
    launch.main()
