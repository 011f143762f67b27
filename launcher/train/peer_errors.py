"""The process group's errors that mean something about the job, in one line instead of gloo's / c10d's
RuntimeError traceback (which names a C++ source line and no cause; docs/bad_inputs.md): another process
of the job gone (the launcher stopped by Ctrl-C or `timeout` during start-up, a rank that ended first), or
the rendezvous port taken on rank 0's node."""
from __future__ import annotations

import os

from launcher.common.defaults import PEER_GONE_PREFIX

_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "Socket closed", "recvValue failed", "failed to recv")


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    if first.startswith("[") and "] " in first:  # gloo's "[../third_party/gloo/.../pair.cc:534] "
        first = first.split("] ", 1)[1]
    return first.split(". ")[0][:200]  # gloo's advice after the cause ("Check the logs ... GLHF!")


def peer_gone(err: BaseException) -> str | None:
    """`RuntimeError: Connection closed by peer [host]:port` when the error means another process of the
    job is gone; None for any other error (a real bug keeps its traceback)."""
    for each in _chain(err):
        if isinstance(each, RuntimeError) and any(phrase in str(each) for phrase in _PEER_GONE):
            return f"{type(each).__name__}: {_first_line(each)}"
    return None


def port_in_use(err: BaseException) -> str | None:
    """The rendezvous store could not listen: its port is taken on rank 0's node."""
    for each in _chain(err):
        if isinstance(each, RuntimeError) and "EADDRINUSE" in str(each):
            port = os.environ.get("MASTER_PORT", "?")
            return (f"the rendezvous port {port} (MASTER_PORT) is in use on rank 0's node "
                    f"{os.environ.get('MASTER_ADDR', '')}: pass another --master_port")
    return None


def rank_stop_line(err: BaseException, rank: str) -> tuple[str, int] | None:
    """(the one line, the exit code) for a rank ended by `err`, or None: let it raise."""
    if isinstance(err, KeyboardInterrupt):
        return f"pretrain (rank {rank}): stopped by Ctrl-C (SIGINT) during start-up", 130
    reason = port_in_use(err)
    if reason is not None:
        return f"pretrain (rank {rank}): error: {reason}", 1
    reason = peer_gone(err)
    if reason is not None:
        return f"{PEER_GONE_PREFIX.format(rank=rank)} ({reason})", 1
    return None
