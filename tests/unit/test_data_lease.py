"""Data in use is leased (issue 63 item 4): a run records a lease in the data it reads, and `data prepare
--overwrite` / `data upload` onto that data refuse while the lease is live, naming the run directory; a stale lease
is taken over with one line. The run is stood in for by a real process holding the real run lock and lease
(launcher/run_dir/lock.py, launcher/run_dir/data_lease.py); the data commands run for real (SentencePiece, moto S3)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_pipeline import open_corpus
from launcher.cli import main
from launcher.config.sections import DataSection
from launcher.run_dir.data_lease import LEASES_DIR, DataLease, _Place, leased_data, live_leases, refuse_leased
from launcher.run_dir.lock import acquire
from tests.support.bad_inputs import refused
from tests.support.corpus_files import raw_corpus
from tests.support.helpers import REPO

# Rank 0 of a run, as far as the data is concerned: the run lock, then the lease, held until killed.
_RUN = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from launcher.config.sections import DataSection
from launcher.run_dir.data_lease import leased_data
from launcher.run_dir.lock import acquire
with acquire({run_dir!r}, command="rank 0"), leased_data(DataSection(data_dir={data!r}), Path({run_dir!r}), 0):
    print("leased", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def start_run(run_dir: Path, data) -> subprocess.Popen:
    code = _RUN.format(repo=str(REPO), run_dir=str(run_dir), data=str(data))
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "leased"
    return process


def test_prepare_overwrite_refuses_data_a_live_run_reads_then_takes_over_its_stale_lease(capsys, tiny_data, copy_of,
                                                                                          tmp_path):
    data, run_dir = copy_of(tiny_data, "data"), tmp_path / "run"
    argv = ["data", "prepare", "--input", *map(str, raw_corpus(tmp_path / "raw")), "--out", str(data),
            "--tokenizer", str(tiny_data), "--shard-tokens", "6000", "--valid-fraction", "0.05", "--overwrite"]
    run = start_run(run_dir, data)
    try:
        [lease] = (data / LEASES_DIR).glob("*.json")
        assert json.loads(lease.read_text())["run_dir"] == str(run_dir.resolve())
        assert open_corpus(data, "train", verify=True).shards  # the lease is invisible to readers
        line = refused(capsys, argv, owned=[data])
        host = socket.gethostname()
        assert f"--out {data}: in use by the run {run_dir.resolve()} (its job on {host} reads it" in line
        assert "wait for that run to end or stop it" in line
    finally:
        run.send_signal(signal.SIGKILL)  # the job dies without releasing anything: lock and lease stay behind
        run.wait()
    assert lease.is_file()
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"took over the data lease of the run {run_dir.resolve()}" in err and f"pid {run.pid} is not running" in err
    assert not (data / LEASES_DIR).exists() and (data / "manifest.json").is_file()


def test_a_run_keeps_other_live_leases_and_releases_its_own(tiny_data, copy_of, tmp_path, capsys):
    data = copy_of(tiny_data, "data")
    other = start_run(tmp_path / "other", data)  # another run reading the same data: runs may share it
    try:
        with acquire(tmp_path / "run", command="rank 0"), leased_data(DataSection(data_dir=str(data)),
                                                                       tmp_path / "run", 0):
            assert len(live_leases(data, "--out")) == 2
        assert [lease.run_dir for _, lease in live_leases(data, "--out")] == [str((tmp_path / "other").resolve())]
        with leased_data(DataSection(data_dir=str(data)), tmp_path / "run", rank=1):
            assert len(list((data / LEASES_DIR).glob("*.json"))) == 1
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    assert "took over" not in capsys.readouterr().err


def test_upload_onto_a_prefix_a_run_reads_is_refused_and_another_hosts_lease_ages_out(capsys, s3_env, tiny_data,
                                                                                       tmp_path):
    location = "s3://roformer-test/leased"
    argv = ["data", "upload", str(tiny_data), location, "--overwrite"]
    with acquire(tmp_path / "run", command="rank 0"), leased_data(DataSection(data_dir=location), tmp_path / "run", 0):
        line = refused(capsys, argv, owned=[], command="data")
        assert f"DESTINATION {location}: in use by the run {(tmp_path / 'run').resolve()}" in line
        assert f"lease {location}/{LEASES_DIR}/" in line
    assert live_leases(location, "--out") == []  # released with its job
    # A run on another host, its run directory not reachable from here: the lease's own refresh age decides.
    place, now = _Place(location), time.time()
    place.write(DataLease("/elsewhere/run", "abc123", "node-7", 4242, now - 900, now - 30))
    with pytest.raises(ValueError, match=r"--out s3://roformer-test/leased: in use by the run /elsewhere/run \(its job "
                                         r"on node-7 reads it; lease .*abc123.json, refreshed 3\d s ago\)"):
        refuse_leased(location, "--out")
    place.write(DataLease("/elsewhere/run", "abc123", "node-7", 4242, now - 900, now - 700))
    notes = []
    refuse_leased(location, "--out", notes.append)
    [note] = notes
    assert note.startswith(f"--out {location}: took over the data lease of the run /elsewhere/run ({location}/"
                           f"{LEASES_DIR}/abc123.json): not refreshed for 70") and note.endswith(" s (bound 600 s)")
    assert live_leases(location, "--out") == [] and _Place(location).leases() == []
    assert main(argv) == 0


def test_a_lease_is_judged_by_the_run_lock_not_by_the_process_that_wrote_it(tiny_data, copy_of, tmp_path):
    """Under `roformer pretrain` the launcher holds the lock and rank 0 writes the lease with the lock's id: live while
    that lock is, stale (taken over with a line) once the job released it, whatever became of rank 0."""
    data = copy_of(tiny_data, "data")
    lock = acquire(tmp_path / "run", command="roformer pretrain")
    now = time.time()
    _Place(data).write(DataLease(str((tmp_path / "run").resolve()), lock.holder.lock_id, socket.gethostname(),
                                 999_999_999, now, now))  # rank 0's pid: not running, the lock's process is
    try:
        [(_, lease)] = live_leases(data, "--out")
        assert lease.lock_id == lock.holder.lock_id
    finally:
        lock.release()
    notes = []
    assert live_leases(data, "--out", notes.append) == []
    assert len(notes) == 1 and "its job ended (no run lock in" in notes[0]
