"""MLflow: MLFLOW_TRACKING_URI (default: a SQLite store HOME/mlflow.db, HOME = RUN_DIR/tracking) and
MLFLOW_EXPERIMENT_NAME (default roformer-ds), MLflow's own variables; credentials come from MLflow's own
places (MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN on the node, ~/.mlflow/credentials), never from run records."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from launcher.common.errors import UserError

DEFAULT_EXPERIMENT = "roformer-ds"
# A request that fails is retried at most this often, each waiting this long (MLflow's own defaults wait minutes).
RETRIES, TIMEOUT_S = "2", "10"
MAX_METRICS, MAX_TAGS = 1000, 100  # MLflow's log_batch limits
STATUS = {"finished": "FINISHED", "stopped": "KILLED", "guard_stopped": "FAILED"}


def tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
BARE_URIS = ("databricks", "databricks-uc", "uc")
"""The tracking URIs MLflow takes without a scheme (a Databricks workspace from its own profile)."""


def check_tracking_uri(environ=os.environ) -> None:
    """MLFLOW_TRACKING_URI, when set, must be a URI: MLflow takes anything else for a local directory relative to
    each rank's working directory (`not a uri` became ./not a uri/ and a file-store notice). One line, before
    the run starts (launcher/inputs/run_checks.py, `finetune --report-to mlflow`) and again where it is opened."""
    value = environ.get("MLFLOW_TRACKING_URI")
    if value and not _SCHEME.match(value) and value not in BARE_URIS:
        raise UserError(f"MLFLOW_TRACKING_URI {value!r}: not a tracking URI; give a server (http://HOST:5000), a "
                        f"database (sqlite:////abs/path/mlflow.db) or a directory as file:///abs/path (unset: "
                        f"RUN_DIR/tracking/mlflow.db)")


class MlflowBackend:
    def __init__(self, home: Path, run_name: str):
        """home: where the tracker's local files go (RUN_DIR/tracking); run_name: the name of a new run."""
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", RETRIES)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", TIMEOUT_S)
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # the job reports where it was told, nowhere else
        from mlflow.tracking import MlflowClient

        check_tracking_uri()
        self.run_name, self.uri = run_name, tracking_uri(home)
        if self.uri.startswith("sqlite:"):
            home.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(self.uri)
        self.run_id = ""

    def where(self) -> dict:
        parts = urlsplit(self.uri)  # user:password@host never reaches the run directory
        host = parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else parts.netloc
        return {"tracking_uri": urlunsplit(parts._replace(netloc=host)), "experiment": self.experiment_name()}

    @staticmethod
    def experiment_name() -> str:
        return os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT

    def open(self, run_id: str | None, params: dict, tags: dict) -> str:
        from mlflow.entities import Param

        if run_id:
            run = self.client.get_run(run_id)
            self.client.update_run(run_id, status="RUNNING")
            known = run.data.params
        else:
            name = self.experiment_name()
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run = self.client.create_run(experiment_id, run_name=self.run_name, tags=tags)
            run_id, known = run.info.run_id, {}
        self.run_id = run_id
        new = [Param(k, v) for k, v in params.items() if k not in known]  # an MLflow param never changes value
        for start in range(0, len(new), 100):
            self.client.log_batch(run_id, params=new[start:start + 100])
        if tags:
            self.send_tags(tags)
        return run_id

    def send(self, items) -> None:
        from mlflow.entities import Metric

        # One timestamp per record, distinct within a batch: a step's values of two attempts pair up by it.
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, item.time_ms or now + i, item.step)
                   for i, item in enumerate(items) for k, v in item.metrics.items()]
        for start in range(0, len(metrics), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_METRICS])
        self.send_tags({k: v for item in items for k, v in item.tags.items()})

    def send_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        pairs = [RunTag(k, str(v)) for k, v in tags.items()]
        for start in range(0, len(pairs), MAX_TAGS):
            self.client.log_batch(self.run_id, tags=pairs[start:start + MAX_TAGS])

    def files(self, files: list[tuple[Path, str]]) -> None:
        for path, folder in files:
            self.client.log_artifact(self.run_id, str(path), artifact_path=folder or None)

    def close(self, outcome: str | None, end_time: float | None = None) -> None:
        """End the tracked run as `outcome` says (None: leave it as it is), at `end_time` (s; None: now)."""
        if outcome in STATUS:
            self.client.set_terminated(self.run_id, status=STATUS[outcome],
                                       end_time=None if end_time is None else int(end_time * 1000))
