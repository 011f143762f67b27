"""Prepared data in S3-compatible object storage (data_pipeline/remote), against a real moto server in its
own process (tests/support/s3_server.py) through the real boto3 client: the same stream as the local
copy, resumable upload, the node-local cache (sha256 check, locks a killed process cannot leave, the
size bound) and the bad inputs, each one line naming the object or field."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data_pipeline import DataError, PretrainBatches, open_corpus
from data_pipeline.remote.cache import cache_usage
from data_pipeline.remote.client import RemoteOptions
from data_pipeline.remote.upload import upload_directory
from tests.support.bad_inputs import refused
from tests.support.helpers import REPO, free_port, tiny_run_config


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def options(tmp_path: Path, **kwargs) -> RemoteOptions:
    return RemoteOptions(cache_dir=str(tmp_path / "cache"), **{"retries": 1, "timeout": 5.0, **kwargs})


def test_remote_stream_is_the_local_stream(s3_env, s3_tiny_data, tiny_data, tmp_path):
    remote = open_corpus(s3_tiny_data, "train", remote_options=options(tmp_path))
    local = open_corpus(tiny_data, "train")
    assert remote.fingerprint == local.fingerprint and remote.location == s3_tiny_data
    a, b = (PretrainBatches(c, rank=1, world_size=2, seed=3) for c in (remote, local))
    for seq_len in (32, 64, 32):
        x, y = a.next_batch(seq_len, 2), b.next_batch(seq_len, 2)
        assert all((x[k] == y[k]).all() for k in x)
    # every shard came through the cache, checked against the manifest's sha256
    for shard in remote.shards:
        assert len(shard.token_ids) == shard.tokens
        assert (shard.path.with_suffix(".bin")).read_bytes() == (tiny_data / "train" / f"{shard.path.name}.bin").read_bytes()


def test_upload_skips_what_is_there_and_writes_the_manifest_last(s3_env, tiny_data, tmp_path):
    first = upload_directory(tiny_data, "s3://roformer-test/upload-twice", multipart_bytes=5 << 20)
    again = upload_directory(tiny_data, "s3://roformer-test/upload-twice")
    assert first.uploaded > 3 and again.uploaded == 0 and again.skipped == first.uploaded
    client = s3_env.client()
    client.delete_object(Bucket="roformer-test", Key="upload-twice/train/shard_00000.bin")
    resumed = upload_directory(tiny_data, "s3://roformer-test/upload-twice")
    assert resumed.uploaded == 1
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="roformer-test", Prefix="upload-twice/")["Contents"]]
    assert "upload-twice/manifest.json" in keys and "upload-twice/tokenizer/spm.model" in keys


def test_tampered_shard_is_refused_naming_it(s3_env, tiny_data, tmp_path):
    upload_directory(tiny_data, "s3://roformer-test/tampered")
    key = "tampered/train/shard_00001.bin"
    client = s3_env.client()
    body = bytearray(client.get_object(Bucket="roformer-test", Key=key)["Body"].read())
    body[10] ^= 0xFF
    client.put_object(Bucket="roformer-test", Key=key, Body=bytes(body))
    corpus = open_corpus("s3://roformer-test/tampered", "train", remote_options=options(tmp_path))
    with pytest.raises(DataError, match=r"s3://roformer-test/tampered/train/shard_00001\.bin: sha256 .* does not "
                                        r"match the manifest's") as err:
        corpus.shards[1].token_ids
    assert s3_env.endpoint in str(err.value) and "\n" not in str(err.value)
    assert not list((tmp_path / "cache").rglob("shard_00001.bin"))  # nothing of it stays


def test_cache_limit_bounds_the_cache_and_evicts_unheld_shards(s3_env, s3_tiny_data, tmp_path):
    sizes = [s.tokens * s.dtype.itemsize for s in open_corpus(s3_tiny_data, "train",
                                                             remote_options=options(tmp_path / "probe")).shards]
    limit = 2 * max(sizes) + 4096  # two shards and the metadata
    corpus = open_corpus(s3_tiny_data, "train", remote_options=options(tmp_path, cache_limit=limit))
    for shard in corpus.shards:
        shard.token_ids
        assert cache_usage(tmp_path / "cache") <= limit
        shard.release()
    held = corpus.shards[0]
    held.token_ids  # held: the least recently used, yet never evicted while mapped
    for shard in corpus.shards[1:]:
        shard.token_ids
        assert cache_usage(tmp_path / "cache") <= limit and held.path.with_suffix(".bin").is_file()
        shard.release()


def test_upload_over_other_prepared_data_needs_overwrite(capsys, s3_env, tiny_data, tmp_path):
    import json
    import shutil

    from launcher.cli import main

    other = tmp_path / "other"
    shutil.copytree(tiny_data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "comment": "another preparation"}))
    assert upload_directory(tiny_data, "s3://roformer-test/taken").uploaded > 0
    assert main(["data", "upload", str(other), "s3://roformer-test/taken"]) == 2
    line = capsys.readouterr().err.strip()
    assert "s3://roformer-test/taken/manifest.json: the location holds other prepared data" in line
    assert "\n" not in line and upload_directory(tiny_data, "s3://roformer-test/taken").uploaded == 0  # untouched
    assert main(["data", "upload", str(other), "s3://roformer-test/taken", "--overwrite"]) == 0


def test_a_cache_dir_holding_other_files_is_refused_and_left_alone(s3_env, s3_tiny_data, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "shard.bin").write_bytes(b"user data")
    with pytest.raises(DataError, match=rf"data.cache_dir {mine}: not empty and not a cache of ours"):
        open_corpus(s3_tiny_data, "train", remote_options=RemoteOptions(cache_dir=str(mine), cache_limit=10**6))
    assert [p.name for p in mine.iterdir()] == ["shard.bin"]


def test_cache_limit_smaller_than_one_shard_is_refused(s3_env, s3_tiny_data, tmp_path):
    with pytest.raises(DataError, match=r"data.cache_limit 1.00 KB is smaller than one shard of s3://roformer-test/tiny"):
        open_corpus(s3_tiny_data, "train", remote_options=options(tmp_path, cache_limit=1000))


@pytest.mark.parametrize("location, env, expected", [
    ("s3://no-such-bucket/tiny", {}, r"no bucket 'no-such-bucket'"),
    ("s3://roformer-test/no-such-prefix", {}, r"s3://roformer-test/no-such-prefix/manifest.json: no manifest at this "
                                             r"prefix"),
    ("s3://roformer-test/tiny", {"AWS_SECRET_ACCESS_KEY": "Xq9zNotTheSecret"}, r"access refused \(\w+: wrong or missing credentials"),
    ("s3://roformer-test/tiny", {"AWS_PROFILE": "no-such-profile"},
     r"s3://roformer-test/tiny: The config profile \(no-such-profile\) could not be found"),
    ("s3://roformer-test/tiny", {"AWS_ENDPOINT_URL": "http://127.0.0.1:{port}"},
     r"http://127.0.0.1:\d+: s3://roformer-test/tiny: HEAD bucket failed after 2 attempts, the last with "
     r"EndpointConnectionError \(retries 1, timeout 2 s: --remote-retries / --remote-timeout, or "
     r"data.remote_retries / remote_timeout of a run config\)"),
    ("s3://roformer-test/tiny", {"AWS_ENDPOINT_URL": "not a url"},
     r"s3://roformer-test/tiny: AWS_ENDPOINT_URL='not a url' is not an endpoint URL \(no http:// or https:// and "
     r"host\): expected http\(s\)://HOST\[:PORT\]$"),
    ("s3://roformer-test/tiny", {"AWS_ENDPOINT_URL": "ftp://127.0.0.1:9"},
     r"AWS_ENDPOINT_URL='ftp://127.0.0.1:9' is not an endpoint URL \(scheme 'ftp'\)"),
    ("s3://roformer-test/tiny", {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:99999"},
     r"AWS_ENDPOINT_URL_S3='http://127.0.0.1:99999' is not an endpoint URL \(port '99999' out of 0-65535\)"),
])
def test_bad_remote_inputs_are_one_line_naming_the_object(capsys, s3_env, s3_tiny_data, tiny_data, tmp_path,
                                                          monkeypatch, location, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(port=free_port()))
    config = tiny_run_config(tmp_path, tiny_data, data={"data_dir": location, "cache_dir": str(tmp_path / "cache"),
                                                        "remote_retries": 1, "remote_timeout": 2.0})
    line = refused(capsys, ["plan", "--config", config, "--world-size", "2"], owned=[tmp_path / "run.yaml"])
    assert re.search(expected, line), line
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in line


def test_global_order_with_a_cache_below_the_corpus_is_refused_by_plan(capsys, s3_env, s3_tiny_data, tiny_data,
                                                                       tmp_path):
    corpus = sum(p.stat().st_size for p in tiny_data.rglob("*.bin"))
    config = tiny_run_config(tmp_path, tiny_data, data={"data_dir": s3_tiny_data, "cache_dir": str(tmp_path / "c"),
                                                        "cache_limit": corpus - 1})
    line = refused(capsys, ["plan", "--config", config, "--world-size", "2"], owned=[tmp_path / "run.yaml"])
    assert f"data.cache_limit {corpus - 1:,} bytes is smaller than the corpus" in line and f"({corpus:,} bytes" in line


def test_plan_shows_the_corpus_against_the_cache(capsys, s3_env, s3_tiny_data, tiny_data, tmp_path):
    from launcher.cli import main

    config = tiny_run_config(tmp_path, tiny_data, data={"data_dir": s3_tiny_data, "cache_dir": str(tmp_path / "c"),
                                                        "cache_limit": "1GB"})
    assert main(["plan", "--config", str(config), "--world-size", "2"]) == 0
    out = capsys.readouterr()
    assert "against data.cache_limit 1.00 GB" in out.out + out.err
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in out.out + out.err


def test_prepare_to_the_bucket_and_refusals_of_the_cli(capsys, s3_env, tiny_data, tmp_path):
    from launcher.cli import main
    from tests.support.corpus_files import raw_corpus

    raw = raw_corpus(tmp_path / "raw")
    argv = ["data", "prepare", "--input", *map(str, raw), "--out", "s3://roformer-test/prepared-cli",
            "--tokenizer", str(tiny_data), "--shard-tokens", "6000", "--valid-fraction", "0.05"]
    assert main(argv) == 0
    corpus = open_corpus("s3://roformer-test/prepared-cli", "train", remote_options=options(tmp_path))
    assert corpus.fingerprint == open_corpus(tiny_data, "train").fingerprint
    line = refused(capsys, argv, owned=[], command="data")
    assert "already holds prepared data" in line
    line = refused(capsys, ["data", "upload", str(raw[0].parent), "s3://roformer-test/x"], owned=[], command="data")
    assert "no manifest" in line


def test_a_shard_a_peer_holds_while_it_waits_for_us_is_read_not_waited_for(s3_env, s3_tiny_data, tiny_data, tmp_path,
                                                                           monkeypatch):
    """CI's deadlock: this rank found shard 0 missing and wanted to download it; meanwhile the peer rank's
    prefetch brought it in, and the peer mapped it (a shared lock) and waited in a collective for this rank.
    A rank that waits for the download lock alone waits for that peer for ever; it must read the copy."""
    import fcntl
    import threading

    from data_pipeline.remote.cache import NodeCache

    corpus = open_corpus(s3_tiny_data, "train", remote_options=options(tmp_path))
    data, relative, _size, sha256 = corpus.shards[0].remote
    path = data.cache.root / relative
    found_missing = threading.Event()
    is_verified = NodeCache._is_verified

    def watched(self, *args, **kwargs):
        verified = is_verified(self, *args, **kwargs)
        if not verified:
            found_missing.set()
        return verified

    monkeypatch.setattr(NodeCache, "_is_verified", watched)
    peer = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)  # the peer's own open
    try:
        fcntl.flock(peer, fcntl.LOCK_SH)  # the peer in its own acquire, before its check
        reader = threading.Thread(target=lambda: corpus.shards[0].token_ids, daemon=True)
        reader.start()
        assert found_missing.wait(30), "this rank never looked for the shard"
        # the peer's copy lands (its prefetch) and the peer keeps it mapped while it waits for this rank
        path.write_bytes((tiny_data / relative).read_bytes())
        path.with_name(f".{path.name}.ok").write_text(sha256)
        reader.join(20)
        assert not reader.is_alive(), "this rank waits for the peer that waits for it"
        assert len(corpus.shards[0].token_ids) == corpus.shards[0].tokens
    finally:
        os.close(peer)  # lets a waiting reader (the bug) end
    corpus.shards[0].release()


_HOLD_DOWNLOAD = """
import sys
sys.path.insert(0, {repo!r})
from data_pipeline import open_corpus
from data_pipeline.remote.client import RemoteOptions
corpus = open_corpus({location!r}, "train", remote_options=RemoteOptions(cache_dir={cache!r}, retries=0, timeout=600))
print("opened", flush=True)
sys.stdin.readline()  # the server is stopped now: the download below hangs mid-way
corpus.shards[0].token_ids
"""


def test_a_process_killed_while_it_downloads_leaves_no_lock(s3_env, s3_tiny_data, tmp_path):
    """The download is under way (the server stopped mid-answer) when its process is SIGKILLed: the next
    opener takes the object over at once and gets the verified shard."""
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", _HOLD_DOWNLOAD.format(repo=str(REPO), location=s3_tiny_data,
                                                                         cache=str(cache))],
                             env=dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened"
        with s3_env.paused():
            child.stdin.write("go\n")
            child.stdin.flush()
            deadline = time.monotonic() + 30
            while not list(cache.rglob(".shard_00000.bin.part")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        assert list(cache.rglob(".shard_00000.bin.part")), "the child never started its download"
    finally:
        child.kill()
    started = time.monotonic()
    corpus = open_corpus(s3_tiny_data, "train", remote_options=options(tmp_path))
    tokens = np.asarray(corpus.shards[0].token_ids)
    assert time.monotonic() - started < 20 and len(tokens) == corpus.shards[0].tokens


def test_dry_run_forwards_the_aws_settings_and_never_shows_a_secret(capsys, s3_env, s3_tiny_data, tiny_data, tmp_path,
                                                                     monkeypatch):
    from launcher.cli import main

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    config = tiny_run_config(tmp_path, tiny_data, data={"data_dir": s3_tiny_data, "cache_dir": str(tmp_path / "c")})
    assert main(["pretrain", "--hostfile", str(REPO / "hostfile"), "--config", str(config),
                 "--run-dir", str(tmp_path / "run"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert f"export AWS_ENDPOINT_URL={s3_env.endpoint};" in out and f"export AWS_ACCESS_KEY_ID={s3_env.access_key};" in out
    assert "AWS_SECRET_ACCESS_KEY=<redacted" in out
    assert s3_env.secret_key not in out + err


def test_shard_window_with_a_cache_below_two_windows_is_refused(capsys, s3_env, s3_tiny_data, tiny_data, tmp_path):
    config = tiny_run_config(tmp_path, tiny_data, data={"data_dir": s3_tiny_data, "cache_dir": str(tmp_path / "c"),
                                                        "cache_limit": "30KB", "order": "shard_window",
                                                        "shard_window": 2})
    line = refused(capsys, ["plan", "--config", config, "--world-size", "2"], owned=[tmp_path / "run.yaml"])
    assert re.search(r"data.cache_limit 30,000 bytes is smaller than what data.order shard_window holds at once at "
                     r"s3://roformer-test/tiny: two windows of data.shard_window 2 shards for each source and for "
                     r"validation, [\d,]+ bytes", line), line


@pytest.mark.parametrize("key, value, expected", [
    ("cache_limit", "2 parsecs", "data.cache_limit: expected a size such as 2GB"),
    ("order", "random", "data.order: must be one of global, shard_window"),
    ("shard_window", 0, "data.shard_window: must be >= 1 shard"),
    ("data_dir", "s3://", "data.data_dir: s3://: no bucket"),
])
def test_bad_remote_settings_are_refused_naming_the_field(capsys, tiny_data, tmp_path, key, value, expected):
    config = tiny_run_config(tmp_path, tiny_data, data={key: value})
    line = refused(capsys, ["plan", "--config", config, "--world-size", "2"], owned=[tmp_path / "run.yaml"])
    assert expected in line, line


def test_named_sources_and_a_mixture_read_the_same_from_the_bucket(s3_env, tmp_path_factory, tmp_path):
    from tests.support.corpus_files import named_sources_dir

    local_dir = named_sources_dir(tmp_path_factory)
    upload_directory(local_dir, "s3://roformer-test/named")
    remote = open_corpus("s3://roformer-test/named", "train", remote_options=options(tmp_path, cache_limit=10**9))
    local = open_corpus(local_dir, "train")
    assert remote.source_names == local.source_names == ["en", "zh"]
    a, b = (PretrainBatches(c, rank=0, world_size=2, seed=9, order="shard_window", shard_window=2)
            for c in (remote, local))
    for mixture in ({"en": 3, "zh": 1}, {"zh": 1}):
        a.set_mixture(mixture)
        b.set_mixture(mixture)
        for _ in range(3):
            x, y = a.next_batch(32, 2), b.next_batch(32, 2)
            assert all((x[k] == y[k]).all() for k in x)
    assert a.state_dict() == b.state_dict()


def test_a_stage_end_mlm_eval_of_a_bucket_run_reads_through_the_runs_own_cache(s3_env, stored_run, copy_of, tmp_path):
    """The detached stage-end job reads the held-out split of an s3:// run through the run's data.cache_dir (a
    user whose home is small set it), not the default cache under ~/.cache."""
    import yaml

    from launcher.stage_evals.job import run_stage_evals

    upload_directory(stored_run.parent / "data", "s3://roformer-test/stored")
    run_dir = copy_of(stored_run)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    cache = tmp_path / "run-cache"
    config["data"].update(data_dir="s3://roformer-test/stored", cache_dir=str(cache))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    written = run_stage_evals(run_dir, "global_step5", "short", ["mlm"])
    report = json.loads(written["mlm"].read_text())
    assert "error" not in report, report
    assert report["data"] == "s3://roformer-test/stored" and report["results"]
    assert cache_usage(cache) > 0  # the held-out shards came through the run's cache
