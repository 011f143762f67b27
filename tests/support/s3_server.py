"""A real S3-compatible server for the tests: moto's standalone server as its own process on 127.0.0.1.

Its own process, so a test can SIGSTOP it (a server that stops answering) and SIGCONT it. The real
boto3 client talks HTTP to it through AWS_ENDPOINT_URL. Authentication is on (moto checks the
signature against its IAM users): the first requests, unauthenticated, create a user with an
access key allowed everything, so wrong credentials are refused as by a real endpoint.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import free_port

# Requests moto serves before it checks credentials: create_user, create_access_key, put_user_policy.
_SETUP_REQUESTS = 3
_POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'


@dataclass
class S3Server:
    process: subprocess.Popen
    endpoint: str
    access_key: str
    secret_key: str
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The variables a client needs (the standard chain's names)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1", **extra}

    def client(self):
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                                              aws_secret_access_key=self.secret_key, region_name="us-east-1")

    @contextmanager
    def paused(self):
        """SIGSTOP the server for the block (connections still open, nothing answered), then SIGCONT."""
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        with_suppressed = self.process.poll() is None
        if with_suppressed:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_s3_server(work: Path, host: str = "127.0.0.1") -> S3Server:
    """host: the address it listens on (the namespace cluster's bridge address, for its nodes)."""
    import boto3

    port = free_port()
    log = work / "moto_server.log"
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_SETUP_REQUESTS), MOTO_PORT=str(port))
    with open(log, "wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                                   env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).read()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto server did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
    iam = boto3.session.Session().client("iam", endpoint_url=endpoint, aws_access_key_id="setup",
                                         aws_secret_access_key="setup", region_name="us-east-1")
    iam.create_user(UserName="roformer")
    key = iam.create_access_key(UserName="roformer")["AccessKey"]
    iam.put_user_policy(UserName="roformer", PolicyName="all", PolicyDocument=_POLICY)
    return S3Server(process, endpoint, key["AccessKeyId"], key["SecretAccessKey"], log)
