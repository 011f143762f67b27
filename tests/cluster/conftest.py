"""Fixtures of tests/cluster: ONE two-node namespace cluster per session (building it costs seconds and
every cluster test shares it), and the corpus its runs train on."""
from __future__ import annotations

import pytest

from tests.support.netns.cluster import NamespacesUnavailable, TwoNodeCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    try:
        nodes = TwoNodeCluster(tmp_path_factory.mktemp("netns")).__enter__()
    except NamespacesUnavailable as err:
        print(f"\ntest_two_node: SKIPPED, the kernel refuses network namespaces here: {err}")
        pytest.skip(f"network namespaces unavailable: {err}")
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(scope="session")
def data_dir(tiny_data):
    return tiny_data
