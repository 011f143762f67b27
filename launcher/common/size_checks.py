"""Sizes that cannot fit in this machine's memory, refused up front with the estimate (docs/bad_inputs.md):
without it the OOM killer ends the command (exit 137, no message, temporary files left) or torch raises
a traceback after minutes of work."""
from __future__ import annotations

import os

from launcher.common.errors import UserError

ROPE_TABLE_BYTES_PER_ENTRY = 64
"""transformers' RoFormerSinusoidalPositionalEmbedding builds its table as a Python list of numpy float64
scalars (~40 bytes each), then float64 and float32 arrays of it: measured order of magnitude per entry."""


def available_bytes() -> int:
    """Memory this process may still use: MemAvailable (Linux), else the physical pages free."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gb(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(flag: str, need: int, how: str) -> None:
    """Refuse `flag` when `need` bytes (estimated as `how` says) exceed the memory available now."""
    free = available_bytes()
    if need > free:
        raise UserError(f"{flag}: needs about {_gb(need)} of memory ({how}), more than the {_gb(free)} available "
                        f"on this machine; give a smaller value")


def check_rope_table(flag: str, max_positions: int, hidden_size: int, heads: int) -> None:
    """transformers' RoPE table of an export: max_positions x head_dim entries, built in host memory."""
    dim = hidden_size // heads
    check_fits(f"{flag} {max_positions:,}", max_positions * dim * ROPE_TABLE_BYTES_PER_ENTRY,
               f"transformers builds its RoPE table of {max_positions:,} x {dim} entries at ~"
               f"{ROPE_TABLE_BYTES_PER_ENTRY} bytes each")


def check_attention(flag: str, seq_len: int, micro: int, hidden_size: int, heads: int, intermediate: int) -> None:
    """One forward pass at `seq_len`: the attention scores and probabilities (heads x L x L, float32, two
    at a time) and the feed-forward activations of one layer."""
    need = micro * (2 * heads * seq_len * seq_len * 4 + 4 * seq_len * (intermediate + 4 * hidden_size))
    check_fits(f"{flag} {seq_len:,}", need, f"{micro} sequence(s) x {heads} heads x {seq_len:,}^2 attention "
                                            f"scores in float32, twice")


def free_bytes(path) -> int:
    """Free bytes of the filesystem that holds `path`, or would hold it (its nearest existing folder)."""
    import shutil
    from pathlib import Path

    place = Path(path).expanduser().absolute()
    while not place.exists() and place != place.parent:
        place = place.parent
    return shutil.disk_usage(place).free


def check_free_space(flag: str, path, need: int, what: str) -> None:
    """Refuse `flag` when the filesystem of `path` has less than `need` bytes free (`what` is written there)."""
    free = free_bytes(path)
    if need > free:
        raise UserError(f"{flag} {path}: needs about {need / 2**20:,.1f} MiB for {what}, but its filesystem has "
                        f"{free / 2**20:,.1f} MiB free; free space or choose another {flag}")


_NO_SPACE = ("No space left on device", "Disk quota exceeded")


def full_disk_line(err: BaseException, outputs: list = ()) -> str | None:
    """The one line for an error caused by a full disk (ENOSPC, EDQUOT, also wrapped by torch or
    safetensors in an error of their own), naming the file (else the command's `outputs`, (flag, path) pairs)
    and the space left there; None for any other error."""
    import errno

    seen = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT) or any(
                text in str(seen) for text in _NO_SPACE):
            name = getattr(seen, "filename", None)
            flag, path = (None, name) if name or not outputs else outputs[0]
            where = f"{flag} {path}: " if flag else f"{path}: " if path else ""
            try:
                free = f" ({free_bytes(path or '.') // 1024:,} kB free)"
            except OSError:
                free = ""
            return f"{where}the filesystem is full{free}: No space left on device; free space, or write elsewhere"
        seen = seen.__cause__ or seen.__context__
    return None
