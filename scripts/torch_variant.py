"""Which torch build `scripts/setup.sh` installs into .venv, and why: one decision, testable on its own.

    python3 scripts/torch_variant.py [--variant auto|cpu|cuda] [--installed VERSION]

prints `key=value` lines for setup.sh (action, variant, spec, index_url, arch_list, reason) and exits
0, or prints one line and exits 2 on a choice it cannot honour. Standard library only: it runs
before .venv exists and never imports torch (importing a CUDA torch on a login node is slow and
proves nothing).

The rules (docs/gpu.md, "Set-up"):
- TORCH_VARIANT=auto (the default): `cuda` when `nvidia-smi` lists at least one GPU, else `cpu`.
- A torch already in .venv is kept when it is of the asked variant (auto keeps any): a CUDA torch
  a user installed by hand, or one installed by an earlier set-up, is never replaced silently.
  An explicit variant that differs from the installed one replaces it.
- cpu: `torch==VERSION+cpu` (PyTorch's CPU wheel; a plain `torch==VERSION` from PyPI is a
  multi-GB CUDA build), from the configured indexes first, then https://download.pytorch.org/whl/cpu.
- cuda: `torch==VERSION+<tag>` from https://download.pytorch.org/whl/<tag>, the tag from the
  driver's CUDA version (the "CUDA Version" nvidia-smi prints: the newest runtime the driver runs)
  and the GPUs' compute capability, see cuda_tag(); TORCH_CUDA_TAG=cuXYZ overrides it.
- arch_list: the GPUs' compute capabilities as TORCH_CUDA_ARCH_LIST spells them ("7.0;9.0"),
  for compiling DeepSpeed's ops for exactly the GPUs present.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

TORCH_VERSION = "2.13.0"
VARIANTS = ("auto", "cpu", "cuda")
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# Driver CUDA version -> wheel tag: the newest CUDA line PyTorch publishes this torch for that the
# driver can run. Within one major version a newer runtime also runs on an older driver (CUDA's minor
# version compatibility), so 12.0-12.7 drivers get cu126 too. Checked newest first.
CUDA_TAGS = ((13, 0, "cu130"), (12, 8, "cu128"), (12, 0, "cu126"))
# CUDA 13 no longer compiles for Volta (sm_70, V100) and earlier; such GPUs stay on the 12.6 line,
# whose wheels include sm_70 kernels.
OLDEST_CC_FOR_CUDA13 = (7, 5)
VOLTA_TAG = "cu126"


class Refused(Exception):
    """A variant that cannot be installed here; the message is the one line printed."""


@dataclass(frozen=True)
class Gpus:
    """What nvidia-smi reports (empty names: no GPU visible)."""

    names: tuple[str, ...]
    capabilities: tuple[tuple[int, int], ...]
    driver_cuda: tuple[int, int] | None
    """The CUDA version of the driver ('CUDA Version: 12.4' in nvidia-smi's banner)."""


@dataclass(frozen=True)
class Decision:
    action: str
    """'install' or 'keep'."""
    variant: str
    """'cpu' or 'cuda'."""
    spec: str
    """The pip requirement (empty when kept)."""
    index_url: str
    """The PyTorch index the wheel comes from."""
    arch_list: str
    """TORCH_CUDA_ARCH_LIST of the GPUs present ('' without GPUs)."""
    reason: str
    """One line for the set-up's output."""

    def render(self) -> str:
        return "".join(f"{key}={value}\n" for key, value in vars(self).items())


def query_gpus(smi: str | None = None) -> Gpus:
    """Ask nvidia-smi (on PATH) for the GPUs; no nvidia-smi, or one that fails, means no GPU."""
    smi = smi or shutil.which("nvidia-smi")
    empty = Gpus((), (), None)
    if not smi:
        return empty
    try:
        listing = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=60, check=True).stdout
        banner = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return empty
    names, caps = [], []
    for line in listing.splitlines():
        name, _, cap = line.rpartition(",")
        match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", cap)
        if name.strip() and match:
            names.append(name.strip())
            caps.append((int(match.group(1)), int(match.group(2))))
    version = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", banner)
    return Gpus(tuple(names), tuple(caps), (int(version.group(1)), int(version.group(2))) if version else None)


def cuda_tag(gpus: Gpus, environ: dict[str, str]) -> tuple[str, str]:
    """(wheel tag, why) for the driver and GPUs seen (see CUDA_TAGS)."""
    override = environ.get("TORCH_CUDA_TAG", "")
    if override:
        if not re.fullmatch(r"cu\d{3}", override):
            raise Refused(f"TORCH_CUDA_TAG={override!r}: expected a PyTorch wheel tag such as cu126")
        return override, f"TORCH_CUDA_TAG={override}"
    if gpus.driver_cuda is None:
        return VOLTA_TAG, f"no driver visible here, {VOLTA_TAG} runs on every CUDA 12 driver (TORCH_CUDA_TAG overrides)"
    major, minor = gpus.driver_cuda
    if major < 12:
        raise Refused(f"the driver supports CUDA {major}.{minor}; torch {TORCH_VERSION} needs a CUDA 12 driver or newer "
                      "(update the driver, or install a torch of your own into .venv first: it is kept)")
    for tag_major, tag_minor, tag in CUDA_TAGS:
        if (major, minor) >= (tag_major, tag_minor):
            if tag_major >= 13 and gpus.capabilities and min(gpus.capabilities) < OLDEST_CC_FOR_CUDA13:
                cc = "%d.%d" % min(gpus.capabilities)
                return VOLTA_TAG, f"driver CUDA {major}.{minor}, but CUDA 13 builds lack compute capability {cc}"
            return tag, f"driver CUDA {major}.{minor}"
    raise AssertionError("CUDA_TAGS covers every 12.x driver")


def installed_variant(version: str) -> str:
    """'cpu' or 'cuda' of an installed torch version string ('2.13.0+cpu', '2.13.0+cu126', '2.13.0')."""
    local = version.partition("+")[2]
    return "cpu" if local == "cpu" else "cuda" if local.startswith("cu") or not local else "other"


def decide(asked: str, installed: str, gpus: Gpus, environ: dict[str, str]) -> Decision:
    if asked not in VARIANTS:
        raise Refused(f"TORCH_VARIANT={asked!r}: expected one of {', '.join(VARIANTS)}")
    arch_list = ";".join(sorted({"%d.%d" % cc for cc in gpus.capabilities}))
    seen = (f"nvidia-smi sees {len(gpus.names)} GPU{'s' * (len(gpus.names) != 1)} ({', '.join(sorted(set(gpus.names)))})"
            if gpus.names else "no GPU visible to nvidia-smi")
    variant = asked if asked != "auto" else ("cuda" if gpus.names else "cpu")
    why = f"TORCH_VARIANT={asked}" + (f": {seen}" if asked == "auto" else "")
    if installed and (asked == "auto" or installed_variant(installed) == variant):
        have = installed_variant(installed)
        hint = (f"; {seen}: TORCH_VARIANT=cuda replaces it" if asked == "auto" and gpus.names and have == "cpu"
                else "")
        return Decision("keep", have, "", "", arch_list,
                        f"torch {installed} already in the venv, kept ({why.split(':')[0]}{hint})")
    if variant == "cpu":
        return Decision("install", "cpu", f"torch=={TORCH_VERSION}+cpu", f"{PYTORCH_INDEX}/cpu", arch_list,
                        f"CPU torch {TORCH_VERSION} ({why})")
    tag, tag_why = cuda_tag(gpus, environ)
    return Decision("install", "cuda", f"torch=={TORCH_VERSION}+{tag}", f"{PYTORCH_INDEX}/{tag}", arch_list,
                    f"CUDA torch {TORCH_VERSION}+{tag} ({why}; {tag_why})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default=os.environ.get("TORCH_VARIANT", "auto"),
                        help="auto, cpu or cuda (default: $TORCH_VARIANT, else auto)")
    parser.add_argument("--installed", default="", help="version of the torch already in the venv ('' = none)")
    args = parser.parse_args(argv)
    try:
        decision = decide(args.variant, args.installed, query_gpus(), dict(os.environ))
    except Refused as err:
        print(f"setup: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(decision.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
