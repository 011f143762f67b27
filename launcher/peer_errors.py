"""A rank whose peers went away (the launcher stopped by Ctrl-C or `timeout` during start-up, another rank
ended first): the process group's error in one line instead of gloo's RuntimeError traceback, which names a
C++ source line and no cause (docs/bad_inputs.md)."""
from __future__ import annotations

_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "Socket closed", "Rank 0 is unreachable", "TCPStore", "recvValue failed", "failed to recv")


def peer_gone(err: BaseException) -> str | None:
    """What a process-group error says in one line when it means another process of the job is gone;
    None for any other error (a real bug keeps its traceback)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RuntimeError):
            text = str(err).strip()
            if any(phrase in text for phrase in _PEER_GONE):
                first = text.splitlines()[0] if text else type(err).__name__
                if "] " in first and first.startswith("["):  # drop gloo's "[../third_party/...pair.cc:534] "
                    first = first.split("] ", 1)[1]
                first = first.split(". ")[0]  # gloo's advice after the cause ("Check the logs ... GLHF!")
                return f"{type(err).__name__}: {first[:200]}"
        err = err.__cause__ or err.__context__
    return None
