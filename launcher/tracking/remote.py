"""A tracker (MLflow, W&B) behind one worker thread of rank 0, so a slow or unreachable server never holds a
training step: records are queued, sent in batches, and each sent record's key is appended to the
sent-ledger RUN_DIR/tracking/<tracker>.sent. The tracker's run id is RUN_DIR/tracking/<tracker>.json, so every
start of the run (resume, restart after a fault, after a guard rewind) continues the same tracked run.

On the first failure the sink says so in one line and stops sending for the rest of this process; at the next
start (or `roformer report RUN_DIR`) the records of metrics.jsonl that are not in the ledger are sent then.
A record is in the ledger only after the tracker accepted it, so it is sent once (a kill between the two
could send one batch twice; a stop never does).
"""
from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

from launcher.common.io import atomic_write_json, write_line
from launcher.run_dir.layout import RunDir
from launcher.tracking.mlflow_backend import MlflowBackend
from launcher.tracking.sink import Sink
from launcher.tracking.translate import Item, eval_items, to_item
from launcher.tracking.wandb_backend import WandbBackend

CLOSE_WAIT_S = 120.0
"""How long the end of a run waits for the queue to drain before leaving the rest to the next start."""
BATCH = 500


def tracking_dir(run_dir: RunDir) -> Path:
    return run_dir.root / "tracking"


def backend(name: str, home: Path, run_name: str, in_rank: bool = False):
    """The tracker `name`, its local files under `home`, a new run named `run_name`; in_rank: in a training rank."""
    if name == "mlflow":
        return MlflowBackend(home, run_name)
    return WandbBackend(home, run_name, detach_service=in_rank)


class Ledger:
    """The tracked run's id (<tracker>.json) and the keys of the records it has (<tracker>.sent, one a line)."""

    def __init__(self, run_dir: RunDir, name: str):
        self.dir = tracking_dir(run_dir)
        self.state_path, self.sent_path = self.dir / f"{name}.json", self.dir / f"{name}.sent"

    def run_id(self) -> str | None:
        try:
            return json.loads(self.state_path.read_text(encoding="utf-8")).get("run_id")
        except (OSError, ValueError):
            return None

    def save_run(self, run_id: str, where: dict) -> None:
        atomic_write_json(self.state_path, {"run_id": run_id, **where})

    def sent(self) -> set[str]:
        if not self.sent_path.is_file():
            return set()
        return set(self.sent_path.read_text(encoding="utf-8").splitlines())

    def add(self, keys: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.sent_path, "a", encoding="utf-8") as handle:
            handle.write("".join(k + "\n" for k in keys))
            handle.flush()


class Connection:
    """One tracker's run, opened (created or continued) on first use; items not in the ledger are sent."""

    def __init__(self, name: str, run_dir: RunDir, params: dict, tags: dict, stage_ends: list[int],
                 in_rank: bool = False):
        self.name, self.run_dir, self.stage_ends, self.in_rank = name, run_dir, stage_ends, in_rank
        self.params, self.tags = params, tags
        self.ledger = Ledger(run_dir, name)
        self.backend = None
        self.sent: set[str] = set()

    def open(self) -> None:
        self.backend = backend(self.name, tracking_dir(self.run_dir), self.run_dir.root.name, self.in_rank)
        run_id = self.backend.open(self.ledger.run_id(), self.params, self.tags)
        self.ledger.save_run(run_id, self.backend.where())
        self.sent = self.ledger.sent()

    def send_records(self, records: list[dict]) -> None:
        self.send_items([item for item in (to_item(r, self.stage_ends) for r in records) if item is not None])

    def send_items(self, items: list[Item]) -> None:
        fresh = [item for item in items if item.key not in self.sent]
        for start in range(0, len(fresh), BATCH):
            chunk = fresh[start:start + BATCH]
            self.backend.send(chunk)
            keys = [item.key for item in chunk]
            self.ledger.add(keys)
            self.sent.update(keys)

    def send_evals(self) -> None:
        self.send_items(eval_items(self.run_dir.evals))

    def send_files(self, files: list[tuple[Path, str]]) -> None:
        present = [(path, where) for path, where in files if path.is_file()]
        if present:
            self.backend.files(present)

    def close(self, outcome: str | None, end_time: float | None = None) -> None:
        if self.backend is not None:
            self.backend.close(outcome, end_time)


def final_files(run_dir: RunDir) -> list[tuple[Path, str]]:
    """(file, artifact folder): report.md and the plots of the run."""
    plots = sorted(run_dir.plots.glob("*.png")) if run_dir.plots.is_dir() else []
    return [(run_dir.report, ""), *((p, "plots") for p in plots)]


class RemoteSink(Sink):
    def __init__(self, name: str, run_dir: RunDir, params: dict, tags: dict, stage_ends: list[int]):
        self.name = name
        self.connection = Connection(name, run_dir, params, tags, stage_ends, in_rank=True)
        self.queue: queue.Queue = queue.Queue()
        self.down = False
        self.thread = threading.Thread(target=self._work, name=f"tracker-{name}", daemon=True)
        self.thread.start()

    def start(self, history: list[dict], start_step: int) -> None:
        self.queue.put(("records", history))
        self.queue.put(("evals", None))

    def record(self, record: dict) -> None:
        if not self.down:
            self.queue.put(("records", [record]))

    def close(self, outcome: str | None = None) -> None:
        self.queue.put(("evals", None))
        self.queue.put(("files", final_files(self.connection.run_dir)))
        self.queue.put(("close", outcome))
        self.thread.join(CLOSE_WAIT_S)
        if self.thread.is_alive():
            write_line(f"tracking: {self.name}: still sending after {CLOSE_WAIT_S:.0f} s; metrics.jsonl keeps every "
                       f"record and the next start of this run sends the rest")

    def _work(self) -> None:
        try:
            self.connection.open()
            while True:
                what, payload = self.queue.get()
                if what == "records":
                    records = list(payload)
                    while not self.queue.empty():  # one batch of whatever queued up meanwhile
                        nxt = self.queue.queue[0]
                        if nxt[0] != "records":
                            break
                        records.extend(self.queue.get()[1])
                    self.connection.send_records(records)
                elif what == "evals":
                    self.connection.send_evals()
                elif what == "files":
                    self.connection.send_files(payload)
                elif what == "close":
                    self.connection.close(payload)
                    return
        except Exception as err:  # noqa: BLE001 - a tracker never stops training
            self.down = True
            write_line(f"tracking: {self.name} unreachable or refused ({type(err).__name__}: {_first_line(err)}); "
                       f"training goes on, metrics.jsonl keeps every record and the next start of this run sends "
                       f"what {self.name} missed")


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else ""
