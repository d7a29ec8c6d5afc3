"""Vela's performance estimate of an Ethos-U payload as the contract's typed cost report.

The payload keeps what Vela said (``meta["perf"]``, ``meta["per_layer"]``, the sizes of its
memory regions); reports read this ``CostReport`` instead, so they name the estimator and
never Vela's keys.
"""

from __future__ import annotations

from typing import Any

from qlower.contract import CostReport, LayerCost, Payload

ESTIMATOR = "Vela"
# memory kind -> the payload's meta key of its size in bytes
MEMORY_KEYS = {"read_only": "read_only_bytes", "command_stream": "command_stream_bytes",
               "scratch": "scratch_size", "scratch_fast": "scratch_fast_size"}
SRAM = "Sram"   # Vela's name of the on-chip SRAM in its memory report


def _count(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"Vela's {what} is not a count: {str(x)[:40]!r}")
    return x


def vela_cost(payload: Payload) -> CostReport | None:
    """The report of an Ethos-U payload's metadata (None when it holds no estimate); ValueError
    when the estimate can't be read."""
    meta = payload.meta
    if "perf" not in meta:
        return None
    perf = meta["perf"]
    if not isinstance(perf, dict):
        raise ValueError("Vela's estimate (perf) is not an object")
    rows = meta.get("per_layer") or []
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError("Vela's per-layer estimate is not a list of rows")
    layers = tuple(LayerCost(str(r.get("operator", "")), _count(r.get("op_cycles", 0), "op_cycles"),
                             _count(r.get("npu_cycles", 0), "npu_cycles"), str(r.get("value", "")),
                             str(r.get("source", "")), str(r.get("tensor", ""))) for r in rows)
    clock = perf.get("core_clock_hz")
    memory = {kind: _count(meta[key], key) for kind, key in MEMORY_KEYS.items() if key in meta}
    memory.update(_device_memory(memory, perf))
    return CostReport(ESTIMATOR, _count(perf.get("total_cycles"), "total_cycles"),
                      _count(perf.get("npu_cycles"), "npu_cycles"), memory,
                      layers, float(clock) if isinstance(clock, int | float) and not isinstance(clock, bool) else None)


def _device_memory(regions: dict[str, int], perf: dict) -> dict[str, int]:
    """The contract's kinds: the driver's arena is both scratch regions, flash holds the read-only
    region and the command stream, SRAM is Vela's peak use of its SRAM memory."""
    out = {}
    if "scratch" in regions:
        out["arena"] = regions["scratch"] + regions.get("scratch_fast", 0)
    if "read_only" in regions and "command_stream" in regions:
        out["flash"] = regions["read_only"] + regions["command_stream"]
    memories = perf.get("memories")
    if isinstance(memories, dict) and isinstance(memories.get(SRAM), dict) and "peak_bytes" in memories[SRAM]:
        out["sram"] = _count(memories[SRAM]["peak_bytes"], f"{SRAM} peak_bytes")
    return out


def cost_problem(payload: Payload) -> str | None:
    """Why a program file's Ethos-U payload holds no readable estimate, or None."""
    try:
        vela_cost(payload)
    except ValueError as e:
        return str(e)
    return None
