"""The DeepSpeed optimizer section after `deepspeed.overrides`, checked where the run config is read (plan,
pretrain --dry-run, every rank) instead of by every rank's optimizer constructor: a TypeError traceback
per rank (`SGD.__init__() got an unexpected keyword argument 'betas'`) otherwise."""
from __future__ import annotations

import copy
import inspect
import os

from launcher.common.errors import UserError

TORCH_ADAM_ENV = "ROFORMER_TORCH_ADAM"
"""1 for every rank when some node cannot build DeepSpeed's FusedAdam (launcher/deepspeed_env/node_check.py decides
before launch; forwarded by the ROFORMER_ prefix)."""


def merged_optimizer(base: dict | None, override: dict | None) -> dict | None:
    """Another optimizer `type` in the overrides replaces the section: the base's parameters belong to the
    base's optimizer (AdamW's betas would reach SGD). The same type merges its parameters as before."""
    if not isinstance(override, dict) or not isinstance(base, dict):
        return copy.deepcopy(override if override is not None else base)
    if "type" in override and str(override["type"]).lower() != str(base.get("type", "")).lower():
        return copy.deepcopy(override)
    merged = {**copy.deepcopy(base), **{k: copy.deepcopy(v) for k, v in override.items() if k != "params"}}
    merged["params"] = {**(base.get("params") or {}), **(override.get("params") or {})}
    return merged


def check_optimizer(section: dict | None, override: dict | None, where: str) -> None:
    """lr is the run config's; a torch.optim optimizer gets only parameters its constructor takes."""
    if isinstance(override, dict) and "lr" in (override.get("params") or {}):
        raise UserError(f"{where}: deepspeed.overrides optimizer.params.lr {override['params']['lr']!r}: the learning "
                        f"rate comes from the run config's optimizer.lr (and its schedule); set optimizer.lr instead")
    if not isinstance(section, dict) or "type" not in section:
        return
    name = str(section["type"])
    try:
        cls = _torch_optimizer(name)
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
    if cls is None:
        return
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params")]
    unknown = sorted(set(section.get("params") or {}) - set(accepted))
    if unknown:
        raise UserError(f"{where}: optimizer.params.{unknown[0]}: {name} (torch.optim.{cls.__name__}) takes no "
                        f"{unknown[0]!r}; its parameters: {', '.join(accepted)}")
    _constructed(cls, name, section.get("params") or {}, where)


def _constructed(cls, name: str, params: dict, where: str) -> None:
    """torch's own checks of the values (nesterov without momentum, a negative momentum, betas out of range),
    by building the optimizer over one scalar: the ranks would raise the same ValueError after start-up.
    lr is the run config's (already checked), so a stand-in value here."""
    import torch

    try:
        cls([torch.zeros(1, requires_grad=True)], **{**params, "lr": 1e-3})
    except (ValueError, TypeError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{where}: optimizer.params {params}: {name} (torch.optim.{cls.__name__}) refuses them: "
                        f"{reason}") from None


DEEPSPEED_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon",
                        "onebitadam", "zerooneadam", "onebitlamb")
"""deepspeed.runtime.config's own optimizer names (and the 1-bit ones), as of DeepSpeed 0.16-0.18: kept here
because importing DeepSpeed where a config is read prints its accelerator line in every command."""


def _torch_optimizer(name: str):
    """The torch.optim class DeepSpeed builds for `name` when it is none of its own optimizers."""
    import torch

    if name.lower() in DEEPSPEED_OPTIMIZERS:
        return None
    cls = getattr(torch.optim, name, None)
    if not inspect.isclass(cls):
        raise UserError(f"optimizer.type {name!r}: neither a DeepSpeed optimizer ({', '.join(DEEPSPEED_OPTIMIZERS)}) "
                        f"nor a torch.optim class (names are case-sensitive there: SGD, RMSprop, ...)")
    return cls


def node_optimizer(ds_config: dict, device_kind: str, environ=None) -> dict:
    """A rank's DeepSpeed config with the job's optimizer choice (TORCH_ADAM_ENV, set by the pre-launch check):
    torch's AdamW, its fused implementation on CUDA. Same update rule as FusedAdam's adam_w_mode
    (tests/unit/test_node_check.py compares one step; the choice: launcher/deepspeed_env/node_check.py)."""
    environ = os.environ if environ is None else environ
    if environ.get(TORCH_ADAM_ENV) != "1":
        return ds_config
    params = ds_config.setdefault("optimizer", {}).setdefault("params", {})
    params["torch_adam"] = True
    if device_kind == "cuda":
        params["fused"] = True
    return ds_config
