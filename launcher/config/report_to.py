"""`logging.report_to` (and `--report-to`): which of the sinks of launcher/tracking/ a run records to."""
from __future__ import annotations

from launcher.common.defaults import KNOWN_SINKS
from launcher.common.errors import UserError


def parse_report_to(value, where: str = "logging.report_to") -> tuple[str, ...]:
    """A list or comma-separated string of KNOWN_SINKS, or 'none' (nothing, TensorBoard included)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: expected a list of {', '.join(KNOWN_SINKS)} or 'none', got {value!r}")
    names = [v.lower() for v in value]
    if "none" in names:
        if len(names) > 1:
            raise UserError(f"{where}: 'none' turns every sink off; it cannot be combined with {names}")
        return ()
    unknown = [n for n in names if n not in KNOWN_SINKS]
    if unknown:
        raise UserError(f"{where}: unknown {', '.join(unknown)} (known: {', '.join(KNOWN_SINKS)}, none)")
    return tuple(dict.fromkeys(names))
