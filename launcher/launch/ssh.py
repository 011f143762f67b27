"""`ssh HOST COMMAND` as every part of `roformer pretrain` runs it: batch mode, bounded in time.

Host names reach ssh as separate arguments (never through a local shell) and were validated by
launcher.launch.hostfile; callers build the remote command from constants and `shlex.quote`d values.
"""
from __future__ import annotations

import subprocess

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
SSH_TIMEOUT_SECONDS = 30


def ssh(host: str, remote_command: str, timeout: float = SSH_TIMEOUT_SECONDS) -> subprocess.CompletedProcess:
    """Run `remote_command` (already quoted) on `host` with the ssh found on PATH."""
    try:
        return subprocess.run(["ssh", *SSH_OPTIONS, host, remote_command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([host], 255, "", f"no answer within {timeout:g} s")
