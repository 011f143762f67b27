"""The device `roformer plan` and `roformer pretrain --dry-run` price a run on, in this order:

1. flags: `--device-name` / `--device-memory` / `--peak-tflops` (plan only);
2. the run config's `hardware.device` (e.g. V100-16GB): its memory and table peak (launcher/common/mfu.py);
3. this machine's accelerator: a GPU's memory and peak, or a CPU's RAM and a timed matmul; but a
   precision this machine cannot train in gets one note and no estimate (a CPU's price of a V100 job
   misleads more than no number).
`logging.peak_tflops` (> 0) replaces the table's peak in 2 and 3.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.common.errors import UserError
from launcher.common.mfu import plan_mfu, resolve_peak, table_peak_tflops
from launcher.deepspeed_env.node_check import planned_optimizer
from launcher.config.hardware_section import parse_memory
from launcher.pricing.estimate import estimate_stages, format_estimates, setup_from_configs


@dataclass(frozen=True)
class Target:
    """What the estimates assume about each rank's device."""

    label: str
    """What it is and where it came from, e.g. 'V100-16GB (hardware.device)'."""
    device_bytes: int
    """Memory per rank for the FITS verdicts."""
    peak_tflops: float
    """Peak TFLOP/s per rank for the time estimate."""
    peak_source: str
    """Where the peak came from, as printed after the time."""
    cpu_ranks: bool
    """The ranks compute on CPUs (launcher/pricing/estimate.py's CPU terms)."""
    product: str = ""
    """The device's product name ('V100', 'NVIDIA H200'): what the measured-MFU table is matched against."""


@dataclass(frozen=True)
class NoTarget:
    """Nothing honest to price on: the one-line note says why and what to give."""

    note: str


def resolve_target(cfg, precision: str, *, device_name: str | None = None, device_memory: str | None = None,
                   peak_tflops: float | None = None) -> Target | NoTarget:
    """The device of the estimates (see the module docstring); UserError naming the flag or field."""
    declared = cfg.hardware
    memory = None
    if device_memory:
        try:
            memory = parse_memory(device_memory)
        except ValueError as err:
            raise UserError(str(err)) from None
    if device_name or declared.device:
        where = "--device-name" if device_name else f"{cfg.source}: hardware.device"
        name = device_name or declared.product_name
        if memory is None:
            if not declared.device or device_name:
                raise UserError(f"--device-name {device_name}: give --device-memory too (e.g. 16GB), or declare "
                                f"the target in the run config: hardware: {{device: {device_name}-16GB}}")
            memory = declared.memory_bytes
        label = f"{name} {memory / 2 ** 30:.0f} GiB ({'flags' if device_name else 'hardware.device'})"
        peak, source = _declared_peak(cfg, name, precision, where, peak_tflops)
        return Target(label, memory, peak, source, cpu_ranks=False, product=name)
    return _this_machine(cfg, precision, memory, peak_tflops)


def _declared_peak(cfg, name: str, precision: str, where: str, peak_tflops: float | None) -> tuple[float, str]:
    if peak_tflops:
        return peak_tflops, "--peak-tflops"
    if cfg.logging.peak_tflops > 0:
        return cfg.logging.peak_tflops, "logging.peak_tflops"
    peak = table_peak_tflops(name, precision)
    if peak is None:
        raise UserError(f"{where}: {name} has no {precision} peak in the table of launcher/common/mfu.py"
                        f"{' (V100 has no bf16: use an fp16 DeepSpeed config)' if 'v100' in name.lower() else ''}; "
                        "give --peak-tflops")
    return peak, f"table: {name} {precision}"


def _this_machine(cfg, precision: str, memory: int | None, peak_tflops: float | None) -> Target | NoTarget:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    kind = accelerator.device_name()
    supported = {"fp32": True, "fp16": accelerator.is_fp16_supported(), "bf16": accelerator.is_bf16_supported()}
    if kind == "cpu" and not supported[precision] and memory is None and not peak_tflops:
        return NoTarget(f"{cfg.source} declares no target (hardware.device) and this machine has no accelerator "
                        f"for its {precision} run ({kind}): memory and time are not estimated; declare it, e.g. "
                        f"hardware: {{device: V100-16GB}}, or give --device-name and --device-memory")
    device_bytes = memory if memory is not None else int(accelerator.total_memory())
    if peak_tflops:
        peak, source, device = peak_tflops, "--peak-tflops", kind
    else:
        resolved = resolve_peak(cfg.logging.peak_tflops, precision)
        if resolved.tflops is None:
            raise UserError(f"no peak known for {resolved.device!r}; give --peak-tflops or --device-name, or "
                            f"declare hardware.device in {cfg.source}")
        peak, source, device = resolved.tflops, f"{resolved.source}: {resolved.device} {resolved.precision}", \
            resolved.device
    return Target(f"this machine: {device}", device_bytes, peak, source, cpu_ranks=kind == "cpu", product=device)


def dry_run_estimate(cfg, stages, world_size: int, ds_json) -> str:
    """The memory / time table `roformer pretrain --dry-run` prints (on the run's target by default, at
    `roformer plan`'s default MFU: measured for the device where there is a measurement, else assumed), or the
    note saying why there is none. `cfg`, `ds_json`: the launch plan's RunConfig and DeepSpeed JSON."""
    target = resolve_target(cfg, ds_json.precision)
    if isinstance(target, NoTarget):
        return f"memory and time: not estimated: {target.note}"
    mfu = plan_mfu(target.product, ds_json.precision)
    setup = setup_from_configs(cfg.model, ds_json, world_size, cfg.schedule.activation_checkpointing,
                               target.cpu_ranks)
    estimates = estimate_stages(stages, setup, target.device_bytes, target.peak_tflops, mfu)
    table = format_estimates(estimates, setup, target.device_bytes, target.peak_tflops, target.peak_source, mfu)
    return f"optimizer: {planned_optimizer(ds_json.config)}\non {target.label}: {table}"


__all__ = ["Target", "NoTarget", "resolve_target", "dry_run_estimate"]
