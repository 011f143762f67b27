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
    def __init__(self, home: Path, run_name: str):
        self.dir, self.run_name, self.run = home, run_name, None

    def where(self) -> dict:
        return {"project": os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, "mode": wandb_mode(),
                "dir": str(self.dir / "wandb")}

    def open(self, run_id: str | None, params: dict, tags: dict) -> str:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
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
        for path, folder in files:  # saved as folder/name: folder is the tail of the file's own directory
            base = path.parents[len(Path(folder).parts)] if folder else path.parent
            self.run.save(str(path), base_path=str(base), policy="now")

    def close(self, outcome: str | None) -> None:
        self.run.finish(exit_code=0 if outcome in (None, "finished", "stopped") else 1)
