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
  and the GPUs' compute capability, from TORCH_CUDA_MATRIX (the lines the pinned torch is published for and
  the architectures each carries), see cuda_tag(); TORCH_CUDA_TAG=cuXYZ overrides it with a published line
  that carries every GPU present.
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
# The CUDA wheels PyTorch publishes for TORCH_VERSION and the architectures each carries: data, kept here beside
# the pin so that a torch bump updates both (docs/gpu.md prints this table). Sources: PyTorch's release
# compatibility matrix (RELEASE.md) for 2.12/2.13 (CUDA 12.6, 13.0, 13.2 experimental; cu128 gone:
# pytorch/pytorch#187075, RFC #178665), the build arch lists of pytorch/test-infra
# (tools/pkg-helpers/pytorch_pkg_helpers/cuda.py), and RFC #172352 / PR #175253 (since 2.11 only the 12.6
# line keeps sm_70, Volta). "+PTX" also runs on newer architectures through the driver's JIT.
TORCH_CUDA_MATRIX: dict[str, dict] = {
    "cu126": {"cuda": (12, 6), "archs": ("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"), "experimental": False},
    "cu130": {"cuda": (13, 0), "archs": ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX"), "experimental": False},
    "cu132": {"cuda": (13, 2), "archs": ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX"), "experimental": True},
}
MATRIX_SOURCE = ("PyTorch release compatibility matrix (pytorch/pytorch RELEASE.md), pytorch/pytorch#187075, "
                 "RFC #178665, RFC #172352 / PR #175253; arch lists: pytorch/test-infra pytorch_pkg_helpers/cuda.py")
# Preferred line per driver major version: any 12.x driver runs cu126 (CUDA's minor-version compatibility), a
# 13.x driver cu130; the experimental line only when asked for by TORCH_CUDA_TAG.
DEFAULT_TAG_BY_DRIVER_MAJOR = {12: "cu126", 13: "cu130"}
FIX_HINT = "TORCH_CUDA_TAG={tag} make setup"


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.removesuffix("+PTX").split(".")
    return int(major), int(minor)


def covers(archs, capability: tuple[int, int]) -> bool:
    """Whether a build for `archs` ('7.0', '9.0+PTX', or torch's 'sm_70' / 'compute_90') runs on a GPU of this
    compute capability: a cubin of the same major and a minor not above it, or PTX of an architecture not above it."""
    for arch in archs:
        ptx = arch.endswith("+PTX") or arch.startswith("compute_")
        if arch.startswith(("sm_", "compute_")):
            digits = arch.split("_", 1)[1].rstrip("af")
            built = (int(digits[:-1]), int(digits[-1]))
        else:
            built = _cc(arch)
        if (ptx and built <= capability) or (built[0] == capability[0] and built[1] <= capability[1]):
            return True
    return False


def tag_for(capabilities, driver_cuda: tuple[int, int] | None) -> str | None:
    """The published line a driver of `driver_cuda` runs that covers every GPU present (None: none does)."""
    major = driver_cuda[0] if driver_cuda else 12
    preferred = [DEFAULT_TAG_BY_DRIVER_MAJOR[m] for m in sorted(DEFAULT_TAG_BY_DRIVER_MAJOR, reverse=True)
                 if m <= major]
    for tag in preferred:
        if all(covers(TORCH_CUDA_MATRIX[tag]["archs"], cc) for cc in capabilities):
            return tag
    return None


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


def _gpu_lacking(tag: str, gpus: Gpus) -> str | None:
    """The first GPU present whose architecture the line's wheels lack, as 'NAME (compute capability X.Y)'."""
    for name, cc in zip(gpus.names, gpus.capabilities):
        if not covers(TORCH_CUDA_MATRIX[tag]["archs"], cc):
            return f"{name} (compute capability {cc[0]}.{cc[1]})"
    return None


def cuda_tag(gpus: Gpus, environ: dict[str, str]) -> tuple[str, str]:
    """(wheel tag, why) for the driver and GPUs seen, from TORCH_CUDA_MATRIX; TORCH_CUDA_TAG overrides, but only
    with a line TORCH_VERSION is published for, carrying every GPU present, that the driver runs."""
    published = ", ".join(TORCH_CUDA_MATRIX)
    override = environ.get("TORCH_CUDA_TAG", "")
    if override:
        if not re.fullmatch(r"cu\d{3}", override):
            raise Refused(f"TORCH_CUDA_TAG={override!r}: expected a PyTorch wheel tag such as cu126 "
                          f"(torch {TORCH_VERSION} is published for {published})")
        if override not in TORCH_CUDA_MATRIX:
            raise Refused(f"TORCH_CUDA_TAG={override}: torch {TORCH_VERSION} is not published for {override} "
                          f"(its CUDA lines: {published})")
        lacking = _gpu_lacking(override, gpus)
        if lacking:
            fix = tag_for(gpus.capabilities, gpus.driver_cuda)
            raise Refused(f"TORCH_CUDA_TAG={override}: torch {TORCH_VERSION}+{override} has no kernels for the "
                          f"{lacking} here" + (f"; use {FIX_HINT.format(tag=fix)}" if fix else ""))
        line = TORCH_CUDA_MATRIX[override]["cuda"]
        if gpus.driver_cuda is not None and gpus.driver_cuda[0] < line[0]:
            raise Refused(f"TORCH_CUDA_TAG={override}: CUDA {line[0]}.{line[1]} needs a CUDA {line[0]} driver; this "
                          f"one runs CUDA {gpus.driver_cuda[0]}.{gpus.driver_cuda[1]}")
        return override, f"TORCH_CUDA_TAG={override}" + (" (experimental line)" if TORCH_CUDA_MATRIX[override]["experimental"] else "")
    default = DEFAULT_TAG_BY_DRIVER_MAJOR[12]
    if gpus.driver_cuda is None:
        return default, f"no driver visible here, {default} runs on every CUDA 12 driver (TORCH_CUDA_TAG overrides)"
    major, minor = gpus.driver_cuda
    if major < 12:
        raise Refused(f"the driver supports CUDA {major}.{minor}; torch {TORCH_VERSION} needs a CUDA 12 driver or newer "
                      "(update the driver, or install a torch of your own into .venv first: it is kept)")
    tag = tag_for(gpus.capabilities, gpus.driver_cuda)
    if tag is None:
        newest = DEFAULT_TAG_BY_DRIVER_MAJOR[max(m for m in DEFAULT_TAG_BY_DRIVER_MAJOR if m <= major)]
        raise Refused(f"no CUDA wheel of torch {TORCH_VERSION} ({published}) that a CUDA {major}.{minor} driver runs "
                      f"has kernels for the {_gpu_lacking(newest, gpus)} here")
    preferred = DEFAULT_TAG_BY_DRIVER_MAJOR[min(major, max(DEFAULT_TAG_BY_DRIVER_MAJOR))]
    if tag != preferred:
        lacking = _gpu_lacking(preferred, gpus)
        return tag, f"driver CUDA {major}.{minor}, but the {preferred} wheels lack the {lacking}"
    return tag, f"driver CUDA {major}.{minor}"


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
