"""A real `mlflow server` (SQLite backend store, local artifact root) on 127.0.0.1 and a free port, for the
tracker tests; stop() and start() again keep its store, so a test can take it down mid-run."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.helpers import free_port

START_SECONDS = 120


class MlflowServer:
    def __init__(self, root: Path):
        self.root, self.port, self.proc = Path(root), free_port(), None
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MlflowServer":
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
        deadline = time.time() + START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            assert self.proc.poll() is None and time.time() < deadline, (self.root / "server.log").read_text()[-3000:]
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)
