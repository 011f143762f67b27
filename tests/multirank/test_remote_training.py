"""Training from S3-compatible object storage (moto's server, its own process; tests/support/s3_server.py):
2 real ranks under DeepSpeed read the bucket through one node-local cache."""
from __future__ import annotations

import re

import torch
from safetensors.torch import load_file

from tests.support.corpus_files import raw_corpus
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, roformer, roformer_env, run_to_end, tiny_run_config


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
