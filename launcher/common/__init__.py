"""What every part of the launcher uses: one-line errors, files never half-written,
values several parts agree on, memory-size refusals, model FLOPs and MFU."""
