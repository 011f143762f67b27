"""Training from S3-compatible object storage (moto's server, its own process; tests/support/s3_server.py):
2 real ranks under DeepSpeed read the bucket through one node-local cache."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.corpus_files import raw_corpus
from tests.support.helpers import (
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    newest_checkpoint,
    roformer,
    roformer_env,
    run_to_end,
    start_run,
    tiny_run_config,
    train_losses,
)


def downloads(server, prefix: str) -> dict[str, int]:
    """GET requests the server answered per shard object under the prefix (its request log)."""
    counts: dict[str, int] = {}
    for match in re.finditer(rf'"GET /roformer-test/{re.escape(prefix)}/(\S+\.bin) HTTP', server.log.read_text()):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def test_a_run_from_the_bucket_ends_with_the_local_runs_weights(s3_server, tiny_data, trainer_run, tmp_path):
    """`data prepare --out s3://` with the session corpus's inputs and tokenizer, then the session's reference
    run (tests/conftest.py trainer_run: same config on the local copy) again from the bucket: the same
    weights, bit for bit, and each shard downloaded once for the node's two ranks."""
    env = roformer_env(**s3_server.env())
    raw = raw_corpus(tmp_path / "raw")
    prepared = roformer("data", "prepare", "--input", *map(str, raw), "--out", "s3://roformer-test/run-a",
                        "--tokenizer", str(tiny_data), "--shard-tokens", "6000", "--valid-fraction", "0.05", env=env)
    assert prepared.returncode == 0, prepared.stderr
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT,
                             data={"data_dir": "s3://roformer-test/run-a", "cache_dir": str(tmp_path / "cache")})
    run_to_end(2, config, tmp_path / "run", module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
               **s3_server.env())
    ours, reference = load_file(str(tmp_path / "run" / "reference.safetensors")), \
        load_file(str(trainer_run / "reference.safetensors"))
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in ours)
    counts = downloads(s3_server, "run-a")
    assert counts and set(counts.values()) == {1}, counts
    log = (tmp_path / "run.log").read_text()
    assert s3_server.secret_key not in log
    # the export takes its tokenizer from the run's data, here the bucket's (through the node's cache)
    exported = roformer("export", str(tmp_path / "run"), "--out", str(tmp_path / "export"), env=env, timeout=300)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "export" / "spm.model").read_bytes() == (tiny_data / "tokenizer" / "spm.model").read_bytes()


class CacheSampler:
    """The cache's shard bytes sampled every 50 ms from this process while runs go on."""

    def __init__(self, cache):
        import threading

        self.cache, self.samples, self._stop = cache, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from data_pipeline.remote.cache import settled_cache_usage

        while not self._stop.wait(0.05):
            self.samples.append(settled_cache_usage(self.cache))

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.samples


@dataclass
class WindowRun:
    data: dict
    """data section of the runs: the small-shard prefix, shard_window 1, the cache limit"""
    limit: int
    reference: Path
    """the uninterrupted run (reference.safetensors: its final weights)"""
    samples: list[int]
    """the cache's shard bytes sampled during it"""


@pytest.fixture(scope="module")
def window_run(s3_server, tiny_data, tmp_path_factory) -> WindowRun:
    """Small shards (one window = one shard of ~1000 tokens) so the tiny schedule crosses many windows, a cache
    limit far below half the corpus (what shard_window 1 holds at once and one more shard fetched ahead), and
    one uninterrupted run on them."""
    root = tmp_path_factory.mktemp("window_run")
    env = roformer_env(**s3_server.env())
    raw = raw_corpus(root / "raw")
    prepared = roformer("data", "prepare", "--input", *map(str, raw), "--out", "s3://roformer-test/run-b",
                        "--tokenizer", str(tiny_data), "--shard-tokens", "1000", "--valid-fraction", "0.05", env=env)
    assert prepared.returncode == 0, prepared.stderr
    manifest = json.loads(s3_server.client().get_object(Bucket="roformer-test", Key="run-b/manifest.json")["Body"].read())
    shard_bytes = {split: sorted(2 * s["tokens"] for s in manifest["splits"][split]["shards"])
                   for split in ("train", "valid")}
    limit = 3 * shard_bytes["train"][-1] + 2 * shard_bytes["valid"][-1]
    assert limit < sum(map(sum, shard_bytes.values())) / 2
    data = {"data_dir": "s3://roformer-test/run-b", "cache_dir": str(root / "cache"), "cache_limit": limit,
            "order": "shard_window", "shard_window": 1}
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, data=data)
    sampler = CacheSampler(root / "cache")
    try:
        run_to_end(2, config, root / "reference", module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
                   **s3_server.env())
    finally:
        samples = sampler.stop()
    return WindowRun(data, limit, root / "reference", samples)


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The losses of every step and the final weights of the uninterrupted run (no dropout: 1e-6)."""
    expected, got = train_losses(reference), train_losses(run_dir)
    assert sorted(got) == sorted(expected) == list(range(1, TINY_TOTAL_STEPS + 1))
    assert all(abs(got[s] - expected[s]) <= 1e-6 for s in expected), (got, expected)
    ours, theirs = (load_file(str(d / "reference.safetensors")) for d in (run_dir, reference))
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-6, rtol=0) for k in ours)


def test_shard_window_under_a_small_cache_resumes_exactly(s3_server, window_run, tiny_data, tmp_path):
    """Stopped mid-stage by SIGTERM and resumed on the same node cache: the uninterrupted run's losses and weights,
    the cache never above its limit (sampled every 50 ms), shards evicted and fetched again."""
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, data=window_run.data)
    sampler = CacheSampler(Path(window_run.data["cache_dir"]))
    try:
        stopped = start_run(2, config, tmp_path / "run", module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT="3",
                            **s3_server.env())
        assert stopped.wait(timeout=600) != 0
        assert newest_checkpoint(tmp_path / "run").sidecar.step in (4, 5)  # mid first stage (6 steps)
        run_to_end(2, config, tmp_path / "run", module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
                   **s3_server.env())
    finally:
        samples = window_run.samples + sampler.stop()
    assert_same_run(tmp_path / "run", window_run.reference)
    assert len(samples) > 100 and max(samples) <= window_run.limit, max(samples)
    gets = downloads(s3_server, "run-b")
    assert len(gets) > 5 and sum(gets.values()) > len(gets), gets  # many shards read, some evicted and read again


def wait_for_step(run_dir: Path, step: int, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while max(train_losses(run_dir) or [0]) < step:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before the step"
        time.sleep(0.1)


def test_a_paused_server_is_ridden_out_and_past_the_retries_the_same_command_resumes(s3_server, window_run,
                                                                                       tiny_data, tmp_path):
    """moto SIGSTOPped mid-run on a cold cache until a request has met the pause, and 3 s more (requests time
    out after 1 s, 5 retries with backoff, ~21 s in all): the run rides it out. Later stopped for good: the rank fails in one line naming endpoint
    and object; once the server is back the same command resumes to the uninterrupted run's weights."""
    data = {**window_run.data, "cache_dir": str(tmp_path / "cache"), "remote_retries": 5, "remote_timeout": 1.0}
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, data=data)
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1", **s3_server.env())
    try:
        wait_for_step(run_dir, 1, proc)
        with s3_server.paused():  # until a request meets it, then 3 s more: well inside the retries' ~21 s
            deadline = time.monotonic() + 30
            while "retry 1/5" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(3)
        assert "retry 1/5" in log.read_text(), "no request met the pause"
        wait_for_step(run_dir, 4, proc)  # ~1000 of the ~4900 units the run reads: windows to fetch are left
        with s3_server.paused():
            code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code != 0
    failures = [line for line in log.read_text().splitlines() if "failed after 6 attempts" in line]
    assert failures and re.search(rf"{re.escape(s3_server.endpoint)}: s3://roformer-test/run-b/\S+: .* the last with "
                                  rf"\w+ \(retries 5, timeout 1 s: --remote-retries / --remote-timeout, or data.remote_retries",
                                  failures[0]), failures
    assert max(train_losses(run_dir)) < TINY_TOTAL_STEPS
    run_to_end(2, config, run_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1", **s3_server.env())
    assert_same_run(run_dir, window_run.reference)
