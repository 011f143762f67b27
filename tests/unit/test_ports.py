"""Rendezvous ports (launcher/launch/ports.py): a claimed port is never handed to a second process of
ours, a port bound by anyone is passed over, and `roformer pretrain` on one machine without
--master_port takes a port no other job of ours holds, and says which."""
from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest

from launcher.common.defaults import DEFAULT_MASTER_PORT
from launcher.common.errors import UserError
from launcher.launch import ports
from launcher.launch.ports import AUTO_PORT_SPAN, claim_default_port, claim_port
from tests.support.helpers import REPO, TEST_PORTS, free_port, roformer, roformer_env, tiny_run_config

HOLD_CLAIMS = ("import sys\nfrom launcher.launch.ports import claim_port\n"
               "first, count = int(sys.argv[1]), int(sys.argv[2])\n"
               "print(*[claim_port(range(first, first + 3 * count)) for _ in range(count)], flush=True)\n"
               "sys.stdin.read()\n")


def test_ports_claimed_by_another_process_are_not_handed_out_until_it_exits():
    first = free_port() + 1  # a stretch of the test range: other processes' claims there are skipped alike
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIMS, str(first), "3"], cwd=REPO, env=roformer_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        held = {int(port) for port in holder.stdout.readline().split()}
        assert len(held) == 3, held
        ours = {claim_port(range(first, first + 9)) for _ in range(3)}
        assert len(ours) == 3 and not ours & held, (ours, held)
    finally:
        holder.communicate("", timeout=30)
    # Its claims end with it: a later claimant may take them.
    assert claim_port(sorted(held)) in held


def test_a_port_bound_by_anyone_is_passed_over():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert claim_port([port, *TEST_PORTS]) != port


def test_two_local_pretrains_without_master_port_get_different_ports_and_say_so(tiny_data, tmp_path):
    # This test process stands for a job already started: it holds the port such a job would take.
    held = claim_default_port(DEFAULT_MASTER_PORT)
    config = tiny_run_config(tmp_path, tiny_data)
    result = roformer("pretrain", "--num_gpus", "1", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                      "--dry-run")
    assert result.returncode == 0, result.stderr
    port = int(re.search(r"master: 127\.0\.0\.1:(\d+)", result.stdout).group(1))
    assert port != held and DEFAULT_MASTER_PORT < port < DEFAULT_MASTER_PORT + AUTO_PORT_SPAN, result.stdout
    assert (f"roformer pretrain: note: rendezvous port {port} ({DEFAULT_MASTER_PORT} is taken; --master_port "
            "chooses one)") in result.stderr.splitlines(), result.stderr


def test_an_explicit_master_port_is_kept_even_where_another_process_claimed_it(tiny_data, tmp_path):
    port = free_port()  # claimed by this process, as a test hands its port to the job it starts
    config = tiny_run_config(tmp_path, tiny_data)
    result = roformer("pretrain", "--num_gpus", "1", "--master_port", str(port), "--config", str(config),
                      "--run-dir", str(tmp_path / "run"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"master: 127.0.0.1:{port}" in result.stdout and "rendezvous port" not in result.stderr


def test_a_lock_directory_that_cannot_be_used_is_one_line_naming_it(monkeypatch, tmp_path):
    blocked = tmp_path / "roformer-ports"
    blocked.write_text("not a directory")
    monkeypatch.setattr(ports, "PORT_LOCK_DIR", blocked)
    with pytest.raises(UserError) as refused:
        claim_port(TEST_PORTS)
    assert str(refused.value) == f"cannot claim a rendezvous port: {blocked} is not a directory; pass --master_port"
