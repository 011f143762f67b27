"""The `hardware:` section of a run config: the accelerator the run is meant for.

    hardware:
      device: V100-16GB     # NAME-MEMORY; NAME as in the peak table of launcher/common/mfu.py

`roformer plan` and `pretrain --dry-run` price memory and time on it (launcher/pricing/target.py), so a
login node plans a GPU run as it will run; flags still win. Only the launching machine reads it, so it is
not part of the run's recorded config.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from launcher.common.mfu import PEAK_TFLOPS_TABLE

DEVICE_RE = re.compile(r"(?P<name>.+?)-(?P<memory>[0-9]*\.?[0-9]+\s*[KMGT]?I?B)", re.IGNORECASE)


@dataclass
class HardwareSection:
    device: str = ""
    """The accelerator of every rank, `NAME-MEMORY` (e.g. V100-16GB, V100-32GB, A100-80GB, H100-80GB): NAME
    must be in the peak table of launcher/common/mfu.py (matched case-insensitively, as a product name would be),
    MEMORY is its memory per device. Empty = the machine `roformer plan` runs on."""

    @property
    def name(self) -> str:
        """The product name part ('V100'), '' when no device is declared."""
        match = DEVICE_RE.fullmatch(self.device.strip())
        return match.group("name") if match else ""

    @property
    def product_name(self) -> str:
        """The name as a device reports it ('H100-PCIe' -> 'H100 PCIe'), for the peak table."""
        return re.sub(r"[-_]+", " ", self.name)

    @property
    def memory_bytes(self) -> int:
        """Memory per device in bytes (GB and GiB both mean 2^30, as vendors size these devices)."""
        match = DEVICE_RE.fullmatch(self.device.strip())
        return parse_memory(match.group("memory"), "hardware.device") if match else 0

    def check(self, fail: Callable[[str, str], None]) -> None:
        """fail(field, message) for a device that is not NAME-MEMORY or not in the peak table."""
        if not self.device:
            return

        known = sorted({key.upper() for key, _ in PEAK_TFLOPS_TABLE})
        if not DEVICE_RE.fullmatch(self.device.strip()):
            fail("hardware.device", f"expected NAME-MEMORY, e.g. V100-16GB or H100-80GB, got {self.device!r}")
        try:
            self.memory_bytes
        except ValueError as err:  # H100-0GB: every stage would be DOES NOT FIT, or worse, priced on nothing
            fail("hardware.device", f"{self.device!r}: {str(err).split(': ', 1)[1]}")
        if not any(key in self.product_name.lower() for key, _ in PEAK_TFLOPS_TABLE):
            fail("hardware.device", f"{self.name!r} is not in the peak table of launcher/common/mfu.py "
                                    f"(known: {', '.join(known)}); add it there, or plan with --peak-tflops")


def parse_memory(text: str, where: str = "--device-memory") -> int:
    """'16GB', '32 GiB', '800MB' -> bytes (GB and GiB both mean 2^30: a '16 GB' V100 has 16 GiB); ValueError
    naming `where` for anything else, and for a size of less than one byte (0GB, -5GB)."""
    match = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", text.upper())
    if not match:
        raise ValueError(f"{where}: expected a size like 16GB or 800MB, got {text!r}")
    size = int(float(match.group(1)) * 1024 ** "_KMGT".index(match.group(2) or "_"))
    if size < 1:
        raise ValueError(f"{where}: must be more than 0 bytes (e.g. 16GB), got {text!r}")
    return size
