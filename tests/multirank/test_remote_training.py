"""Training from S3-compatible object storage (moto's server, its own process; tests/support/s3_server.py):
2 real ranks under DeepSpeed read the bucket through one node-local cache."""
from __future__ import annotations

import json
import re

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


class CacheSampler:
    """The cache's shard bytes sampled every 50 ms from this process while runs go on."""

    def __init__(self, cache):
        import threading

        self.cache, self.samples, self._stop = cache, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        from data_pipeline.remote.cache import cache_usage

        while not self._stop.wait(0.05):
            self.samples.append(cache_usage(self.cache))

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.samples


def test_shard_window_under_a_small_cache_resumes_exactly(s3_server, tiny_data, tmp_path):
    """Small shards (one window = one shard of ~1000 tokens) so the tiny schedule crosses many windows; a cache
    limit far below half the corpus; an uninterrupted run, and one stopped mid-stage by SIGTERM then resumed:
    the same losses and weights (no dropout, 1e-6), the cache never above its limit."""
    env = roformer_env(**s3_server.env())
    raw = raw_corpus(tmp_path / "raw")
    prepared = roformer("data", "prepare", "--input", *map(str, raw), "--out", "s3://roformer-test/run-b",
                        "--tokenizer", str(tiny_data), "--shard-tokens", "1000", "--valid-fraction", "0.05", env=env)
    assert prepared.returncode == 0, prepared.stderr
    manifest = json.loads(s3_server.client().get_object(Bucket="roformer-test", Key="run-b/manifest.json")["Body"].read())
    shard_bytes = {split: sorted(2 * s["tokens"] for s in manifest["splits"][split]["shards"])
                   for split in ("train", "valid")}
    corpus_bytes = sum(map(sum, shard_bytes.values()))
    # what shard_window 1 holds at once (two train, two valid windows) and one more shard fetched ahead
    limit = 3 * shard_bytes["train"][-1] + 2 * shard_bytes["valid"][-1]
    assert limit < corpus_bytes / 2
    cache = tmp_path / "cache"
    data = {"data_dir": "s3://roformer-test/run-b", "cache_dir": str(cache), "cache_limit": limit,
            "order": "shard_window", "shard_window": 1}
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, data=data)
    sampler = CacheSampler(cache)
    try:
        run_to_end(2, config, tmp_path / "reference", module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
                   **s3_server.env())
        stopped = start_run(2, config, tmp_path / "run", module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT="3",
                            **s3_server.env())
        assert stopped.wait(timeout=600) != 0
        assert newest_checkpoint(tmp_path / "run").sidecar.step in (4, 5)  # mid first stage (6 steps)
        run_to_end(2, config, tmp_path / "run", module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
                   **s3_server.env())
    finally:
        samples = sampler.stop()
    expected, got = train_losses(tmp_path / "reference"), train_losses(tmp_path / "run")
    assert sorted(got) == sorted(expected) == list(range(1, TINY_TOTAL_STEPS + 1))
    assert all(abs(got[s] - expected[s]) <= 1e-6 for s in expected), (got, expected)
    ours, reference = (load_file(str(tmp_path / d / "reference.safetensors")) for d in ("run", "reference"))
    assert all(torch.allclose(ours[k], reference[k], atol=1e-6, rtol=0) for k in ours)
    assert len(samples) > 100 and max(samples) <= limit, max(samples)
    gets = downloads(s3_server, "run-b")
    assert len(gets) > 5 and sum(gets.values()) > len(gets), gets  # many shards read, some evicted and read again
