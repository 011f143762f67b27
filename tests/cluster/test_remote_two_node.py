"""Two nodes that share no data directory train from S3-compatible object storage (moto's server on the
namespace cluster's bridge address; tests/support/s3_server.py). Each node's cache directory is its own (a
tmpfs over the same path in each node's mount namespace); only the run directory is shared. The nodes find
the endpoint in the forwarded AWS_ENDPOINT_URL and their credentials in a credentials file
(AWS_SHARED_CREDENTIALS_FILE): secrets themselves are never forwarded nor written into the run directory."""
from __future__ import annotations

import re

import pytest
import yaml

from tests.support.helpers import metrics_steps, roformer
from tests.support.netns.jobs import assert_nothing_left, cluster_env, cluster_hostfile, cluster_run_config
from tests.support.s3_server import start_s3_server


def test_two_nodes_without_a_shared_data_directory_train_from_the_bucket(cluster, tmp_path, tiny_data):
    from data_pipeline.remote.upload import upload_directory

    server = start_s3_server(tmp_path, host=f"{cluster.subnet}.1")
    try:
        server.client().create_bucket(Bucket="roformer-test")
        with pytest.MonkeyPatch.context() as patch:
            for key, value in server.env().items():
                patch.setenv(key, value)
            upload_directory(tiny_data, "s3://roformer-test/cluster")
        credentials = tmp_path / "aws_credentials"
        credentials.write_text(f"[default]\naws_access_key_id = {server.access_key}\n"
                               f"aws_secret_access_key = {server.secret_key}\n")
        credentials.chmod(0o600)
        cache = tmp_path / "cache"
        cache.mkdir()
        for node in cluster.node_names:
            cluster.hide_directory_on(node, cache)  # node-local: each node sees its own empty directory here
        config = cluster_run_config(tmp_path, tiny_data, wide_steps=6)
        raw = yaml.safe_load(config.read_text())
        raw["data"].update(data_dir="s3://roformer-test/cluster", cache_dir=str(cache))
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        env = {k: v for k, v in cluster_env(cluster).items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=server.endpoint, AWS_SHARED_CREDENTIALS_FILE=str(credentials),
                   AWS_DEFAULT_REGION="us-east-1")
        run_dir = tmp_path / "run"
        result = roformer("pretrain", "--hostfile", str(cluster_hostfile(tmp_path)), "--launcher", "pdsh",
                          "--config", str(config), "--run-dir", str(run_dir), env=env, timeout=420)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        assert metrics_steps(run_dir) == list(range(1, 17))
        gets: dict[str, int] = {}
        for match in re.finditer(r'"GET /roformer-test/cluster/(\S+\.bin) HTTP', server.log.read_text()):
            gets[match.group(1)] = gets.get(match.group(1), 0) + 1
        assert gets and set(gets.values()) == {2}, gets  # every shard once per node: two caches
        assert not list(cache.rglob("*.bin"))  # the launching side read the metadata only
        env_file = (run_dir / ".deepspeed_env").read_text()
        assert f"AWS_ENDPOINT_URL={server.endpoint}" in env_file
        assert f"AWS_SHARED_CREDENTIALS_FILE={credentials}" in env_file
        for path in run_dir.rglob("*"):
            if path.is_file() and path.stat().st_size < 10**7:
                assert server.secret_key.encode() not in path.read_bytes(), path
        assert_nothing_left(cluster, run_dir)
    finally:
        server.stop()
