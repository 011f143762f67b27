"""Bad-input tests' helpers: run a real command, expect one line and exit 2, and check that nothing the
user owned changed (every file hashed before and after)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from launcher.cli import main as cli_main


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file and directory under `roots`: sha256 of files, '<dir>' for directories."""
    seen = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))] if root.exists() else []:
            seen[str(path)] = "<dir>" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def refused(capsys, argv: list[str], owned: list[Path], command: str | None = None, progress: bool = False) -> str:
    """`roformer ARGV`: exit 2, one line `roformer COMMAND: error: ...`, every owned file unchanged; the line.
    progress: the command's progress lines may come first (data prepare), no traceback among them."""
    before = snapshot(*owned)
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    command = command or argv[0]
    if progress:
        assert not any("Traceback" in line or ": error: " in line for line in err[:-1]), err
        err = err[-1:]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"roformer {command}: error: "), (rc, err)
    assert snapshot(*owned) == before
    return err[0]


def ran_ok(capsys, argv: list) -> str:
    """`roformer ARGV` in this process: exit 0; its stderr."""
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 0, err
    return err
