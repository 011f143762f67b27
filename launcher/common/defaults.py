"""Values that several parts of the launcher must agree on, defined once."""
from __future__ import annotations

import signal

BAD_INPUT_EXIT_CODE = 2
"""A command or rank refused its input (one line on stderr naming the problem)."""
ORDERLY_STOP_EXIT_CODE = 143
"""A rank stopped on SIGTERM/SIGINT after writing a checkpoint (128 + SIGTERM, as a shell reports it):
a requested stop, not a failure. The rank entry exits with it; the rank guard and the supervisor
recognise it."""
RANK_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What a rank (and `roformer pretrain`) takes as a stop request (launcher/train/stop_signals.py); its wrapper
holds them blocked until the rank entry's handlers exist (launcher/launch/rank_process.py). SIGHUP (a terminal
or ssh session closing) is a stop like SIGTERM (issue 63): checkpoint, one line, exit 129 for the command."""


def stop_signals_to_handle() -> tuple[signal.Signals, ...]:
    """RANK_STOP_SIGNALS less a SIGHUP this process was started ignoring (`nohup`: the user asked for the
    job to outlive the terminal, so a hang-up is no stop)."""
    return tuple(s for s in RANK_STOP_SIGNALS if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN)


GUARD_STOP_EXIT_CODE = 3
"""The numerics guard ended the run (a loss spike, a non-finite figure, a stuck fp16 loss scale: its one
line names step, figure, window median and threshold; launcher/train/guard_actions.py). Not a fault:
`--max-restarts` does not retry it (a restart would meet the same spike)."""
HUNG_EXIT_CODE = 124
"""The hang watchdog stopped the job: a rank made no progress within its bound (launcher.launch.watchdog;
124 as `timeout` reports a command that ran out of time). The newest complete checkpoint is intact:
re-run the same command to resume."""
TRACKERS = ("mlflow", "wandb")
"""The remote trackers rank 0 can record to (launcher/tracking/remote.py runs each behind a worker thread)."""
KNOWN_SINKS = ("tensorboard", *TRACKERS)
"""What `logging.report_to` may name (launcher/config/report_to.py parses it, launcher/tracking/ opens them)."""
DEFAULT_MASTER_PORT = 29500
"""Rendezvous TCP port on rank 0's host: DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT."""
BROKEN_PIPE_EXIT_CODE = 141
"""The reader of a command's output went away (`roformer finetune ... | head`): the command stops
quietly with 128 + SIGPIPE, as other Unix tools killed by SIGPIPE do."""
PROGRESS_ENV = "ROFORMER_PROGRESS"
"""How rank 0 reports progress (launcher/train/progress_line.py): "lines" (default: a plain line every N
steps) or "status" (set by `roformer pretrain` when its output is a terminal)."""
STATUS_MARKER = "[roformer-progress] "
"""Prefix of rank 0's status lines in "status" mode; `roformer pretrain` (launcher/launch/console.py)
shows them as one status line redrawn in place, and keeps them out of the log."""
RANK_ERROR_PREFIX = "pretrain (rank {rank}): error: "
"""How a rank's own error line starts (bad input, a failed save, a guard stop: launcher/train/rank.py). It is
one line, written whole (launcher.common.io.write_line); `roformer pretrain` names the first one on its last
line (launcher/launch/supervise.py)."""
PEER_GONE_PREFIX = "pretrain (rank {rank}): stopped: another process of the job is gone"
"""How a rank that failed only because another process of the job ended starts its line
(launcher/train/peer_errors.py): `roformer pretrain` names the other process as the cause, whichever exit it saw first."""
