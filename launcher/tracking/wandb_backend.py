"""Weights & Biases: WANDB_PROJECT (default roformer-ds), WANDB_MODE (default: offline unless an API key is
set or `wandb login` stored one), files under HOME/wandb (HOME = RUN_DIR/tracking) (`wandb sync` uploads an offline run).
The API key stays where W&B keeps it; it is never forwarded to the ranks' env file nor written to the run."""
from __future__ import annotations

import netrc
import secrets
import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_PROJECT = "roformer-ds"
SERVICE_IDLE_TIMEOUT = "2m"  # after its last client (the rank) has gone
# Starts W&B's service detached and prints its token: the service outlives this short process, so it is no
# child of the rank (DeepSpeed's launcher terminates every descendant of a rank when a stop begins).
START_SERVICE = ("from wandb import Settings; from wandb.sdk.lib.service import service_process as s; "
                 "print(s.start_detached(Settings(), idle_timeout=%r).token.env_value)")


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        return bool(netrc.netrc().authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if has_api_key() else "offline")


class WandbBackend:
    def __init__(self, home: Path, run_name: str, detach_service: bool = False):
        """detach_service: run W&B's service outside this process's tree (a training rank's)."""
        self.dir, self.run_name, self.run, self.detach_service = home, run_name, None, detach_service

    def where(self) -> dict:
        return {"project": os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, "mode": wandb_mode(),
                "dir": str(self.dir / "wandb")}

    def open(self, run_id: str | None, params: dict, tags: dict) -> str:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # the job reports where it was told, nowhere else
        if self.detach_service and not os.environ.get("WANDB_SERVICE"):
            start_detached_service()
        if run_id:
            _wait_for_a_second_of_its_own(self.dir / "wandb", run_id)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True, disable_git=True,
                                  save_code=False)
        self.run = wandb.init(id=run_id or secrets.token_hex(4), resume="allow", dir=str(self.dir),
                              project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, mode=wandb_mode(),
                              name=self.run_name, config=params, settings=settings)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.run.summary.update(tags)
        return self.run.id

    def send(self, items) -> None:
        for item in items:
            if item.metrics:
                self.run.log({**item.metrics, "step": item.step})
            if item.tags:
                self.run.summary.update(item.tags)

    def files(self, files: list[tuple[Path, str]]) -> None:
        import shutil

        for path, folder in files:  # a copy inside W&B's run folder (else W&B symlinks it, warning at each file)
            target = Path(self.run.dir) / folder / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            self.run.save(str(target), base_path=self.run.dir, policy="now")

    def close(self, outcome: str | None, end_time: float | None = None) -> None:  # W&B's end is the finish call's
        self.run.finish(exit_code=0 if outcome in (None, "finished", "stopped") else 1)


def _wait_for_a_second_of_its_own(wandb_dir: Path, run_id: str) -> None:
    """W&B names a start's folder by its second ((offline-)run-YYYYmmdd_HHMMSS-ID): a second start of the run
    within the same second finds that folder's run file taken and its records are lost."""
    import time
    from datetime import datetime

    def taken() -> bool:
        second = f"{datetime.now():%Y%m%d_%H%M%S}"
        return any((wandb_dir / f"{mode}-{second}-{run_id}").exists() for mode in ("run", "offline-run"))

    while taken():
        time.sleep(0.05)


def start_detached_service() -> None:
    """WANDB_SERVICE for this process: a W&B service no rank's stop takes down (W&B starts its own otherwise)."""
    import subprocess
    import sys

    try:
        out = subprocess.run([sys.executable, "-c", START_SERVICE % SERVICE_IDLE_TIMEOUT], capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return
    if out:
        os.environ["WANDB_SERVICE"] = out[-1]
