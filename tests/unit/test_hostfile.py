"""Hostfile parsing/validation and the include/exclude/num_nodes/num_gpus resolution."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.launch.hostfile import (
    check_hostname,
    is_local_only,
    parse_hostfile_text,
    read_hostfile,
    resolve_resources,
    world_size_of,
)
from launcher.common.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def test_reference_hostfile_is_two_nodes_of_four_slots():
    hostfile = read_hostfile(REPO / "hostfile")
    assert [(h.name, h.slots) for h in hostfile.hosts] == [("node1", 4), ("node2", 4)]
    assert world_size_of(resolve_resources(hostfile)) == 8


def test_comments_blank_lines_and_trailing_comments():
    text = "# cluster\n\n  worker-0 slots=2   # rack A\n\t\nworker-1.example.org\tslots=3\n# end\n"
    hostfile = parse_hostfile_text(text, "hf")
    assert [(h.name, h.slots, h.line) for h in hostfile.hosts] == [
        ("worker-0", 2, 3),
        ("worker-1.example.org", 3, 5),
    ]
    assert hostfile.render() == "worker-0 slots=2\nworker-1.example.org slots=3\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("node1 slots=4\nnode1 slots=2\n", "hf:2: duplicate host 'node1' (first listed on line 1)"),
        ("node1 slots=0\n", "hf:1: slots must be >= 1, got 0"),
        ("node1 slots=-2\n", "hf:1: slots must be >= 1, got -2"),
        ("node1 slots=four\n", "hf:1: slots must be a whole number, got 'four'"),
        ("node1 slots=\n", "hf:1: slots must be a whole number, got ''"),
        ("node1\n", "hf:1: missing slots=N"),
        ("node1 slots=2 max_slots=4\n", "hf:1: unknown key 'max_slots'"),
        ("node1 slot=2\n", "hf:1: unknown key 'slot'"),
        ("node1 slots=2 slots=3\n", "hf:1: slots given twice"),
        ("node1 4\n", "hf:1: expected key=value after the host name, got '4'"),
        ("# only comments\n\n", "hf: no hosts"),
        ("ok slots=1\n\nnode1;rm -rf ~ slots=1\n", "hf:3: 'node1;rm' is not a valid host name"),
        ("$(touch /tmp/pwned) slots=1\n", "hf:1: '$(touch' is not a valid host name"),
        ("`id` slots=1\n", "hf:1: '`id`' is not a valid host name"),
        ("-oProxyCommand=x slots=1\n", "hf:1: '-oProxyCommand=x' is not a valid host name"),
        ("node1&&id slots=1\n", "hf:1: 'node1&&id' is not a valid host name"),
        ("user@node1 slots=1\n", "hf:1: 'user@node1' is not a valid host name"),
        ("node1: slots=1\n", "hf:1: 'node1:' is not a valid host name"),
    ],
)
def test_bad_hostfiles_name_file_line_and_problem(text, message):
    with pytest.raises(UserError) as err:
        parse_hostfile_text(text, "hf")
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["node1", "n", "10.0.0.7", "gpu-a100_03.cluster.local", "A1"])
def test_hostname_characters_accepted(name):
    assert check_hostname(name, "x") == name


@pytest.mark.parametrize(
    "name", ["node1;id", "$(id)", "a b", "node1|x", "-x", "x-", ".x", "x..y", "a" * 64, "nöde", "x\ny", ""]
)
def test_hostname_characters_refused(name):
    with pytest.raises(UserError):
        check_hostname(name, "x")


def test_missing_hostfile_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_hostfile(tmp_path / "nope")


HOSTS = parse_hostfile_text("a slots=4\nb slots=4\nc slots=2\n", "hf")


def test_include_exclude_num_nodes_num_gpus_resolve_like_deepspeed():
    assert resolve_resources(HOSTS) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1]}
    assert resolve_resources(HOSTS, include="b@a:0,2") == {"a": [0, 2], "b": [0, 1, 2, 3]}
    assert resolve_resources(HOSTS, exclude="b@a:3") == {"a": [0, 1, 2], "c": [0, 1]}
    assert resolve_resources(HOSTS, num_nodes=2) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    assert resolve_resources(HOSTS, num_nodes=2, num_gpus=1) == {"a": [0], "b": [0]}
    assert world_size_of(resolve_resources(HOSTS, exclude="c")) == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"include": "d"}, "--include: host 'd' is not in hf (hosts: a, b, c)"),
        ({"exclude": "a@zz:1"}, "--exclude: host 'zz' is not in hf"),
        ({"include": "a:4"}, "--include: host 'a' has slots 0..3 in hf, not 4"),
        ({"include": "a:x"}, "--include: slot 'x' on host 'a' is not a whole number"),
        ({"include": "a;id"}, "--include: 'a;id' is not a valid host name"),
        ({"include": "a", "exclude": "b"}, "mutually exclusive"),
        ({"include": "a", "num_gpus": 1}, "cannot be combined"),
        ({"num_nodes": 4}, "--num_nodes 4: hf lists only 3 host(s)"),
        ({"num_gpus": 3}, "--num_gpus 3: host 'c' has slots=2 (hf:3)"),
        ({"exclude": "a@b@c"}, "leaves no host"),
    ],
)
def test_bad_filters_name_the_flag_and_host(kwargs, message):
    with pytest.raises(UserError) as err:
        resolve_resources(HOSTS, **kwargs)
    assert message in str(err.value)


def test_num_gpus_checked_only_on_hosts_that_are_used():
    # 'c' has 2 slots but --num_nodes 2 drops it, so 3 ranks per host is fine.
    assert resolve_resources(HOSTS, num_nodes=2, num_gpus=3) == {"a": [0, 1, 2], "b": [0, 1, 2]}


def test_local_resources_without_hostfile():
    assert resolve_resources(None, num_gpus=2) == {"localhost": [0, 1]}
    assert resolve_resources(None, local_slots=3) == {"localhost": [0, 1, 2]}
    assert is_local_only(resolve_resources(None, num_gpus=2))
    assert not is_local_only(resolve_resources(HOSTS))
    with pytest.raises(UserError, match="need a --hostfile"):
        resolve_resources(None, include="a")
