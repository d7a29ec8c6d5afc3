"""A loaded Ethos-U payload's Vela files, derived again from its validated TOSA graph.

``command_stream.bin`` and ``read_only.bin`` are what a device runs and what
``Program.artifacts()`` and the TFLite export hand out for deployment, so a program file's
copies are never trusted: Vela (deterministic; remembered by digest in ``vela.COMPILED``)
compiles the TOSA graph the load already proved to be qlower's lowering, for the accelerator,
system config and memory mode the payload names, and every byte must be the same. What the
payload's metadata says about Vela's output (IO layout, scratch sizes, estimates) must be what
that compile reports.
"""

from __future__ import annotations

import json
from typing import Any

from qlower.backends.derived import first_difference
from qlower.backends.ethosu.vela import OPTIMISE_GOALS, VelaConfig, VelaResult, compile_cached, vela_config
from qlower.backends.tosa.backend import GRAPH_BLOB, TRACE_BLOB
from qlower.contract import Payload
from qlower.errors import QlowerError

VELA_BLOBS = ("command_stream.bin", "read_only.bin")


def _as_json(x: Any) -> Any:
    return json.loads(json.dumps(x))


def optimise_goals(meta: dict) -> tuple[str, ...]:
    """The Vela goals a payload's metadata can mean. Files written before the goal was recorded
    (issue 30) have no ``optimise``: they were compiled with either, so both are tried, the
    default first (the bytes decide, each derived again in full). A recorded goal is matched
    without regard to case, as the option text is parsed (``size`` is ``Size``); anything else
    means none."""
    if "optimise" not in meta:
        return OPTIMISE_GOALS
    stated = meta["optimise"]
    return tuple(g for g in OPTIMISE_GOALS if isinstance(stated, str) and stated.lower() == g.lower())


def derived_compile(payload: Payload) -> tuple[str | None, VelaResult | None, VelaConfig | None]:
    """(why ``payload``'s Vela files or Vela facts are not what Vela makes of its TOSA graph, None, None),
    or (None, Vela's compile of it, the configuration it was compiled for)."""
    meta = payload.meta
    allowed = {GRAPH_BLOB, TRACE_BLOB, *VELA_BLOBS}
    unexpected = sorted(set(payload.blobs) - allowed)
    if unexpected:
        return f"it holds an unexpected blob {unexpected[0][:40]!r}", None, None
    if meta.get("accelerator") != payload.target:
        return (f"its metadata names accelerator {str(meta.get('accelerator'))[:40]!r}, its target is "
                f"{payload.target!r}"), None, None
    system, memory = meta.get("system_config"), meta.get("memory_mode")
    goals = optimise_goals(meta)
    if not isinstance(system, str) or not isinstance(memory, str) or not goals:
        return "its Vela configuration (system_config, memory_mode, optimise) is not a valid one", None, None
    try:
        config = vela_config(payload.target, system, memory)
        # a file of before the goal was recorded: the goal whose bytes it holds (else the default's, reported)
        results = {}
        for optimise in goals:
            results[optimise] = result = compile_cached(payload.blobs[GRAPH_BLOB], config, "per_layer" in meta,
                                                        optimise)
            if all(payload.blobs.get(name) == derived
                   for name, derived in zip(VELA_BLOBS, (result.command_stream, result.read_only))):
                break
        else:
            optimise = goals[0]
            result = results[optimise]
    except QlowerError as e:
        return f"its Vela files can't be derived again from its validated {GRAPH_BLOB}: {str(e)[:300]}", None, None
    meta["optimise"] = optimise   # normalised: the goal's own spelling, recorded when the file had none
    for name, derived in zip(VELA_BLOBS, (result.command_stream, result.read_only)):
        if payload.blobs.get(name) != derived:
            return (f"its {name} is not what Vela makes of its validated {GRAPH_BLOB} for {payload.target} "
                    f"({system} / {memory}, optimise {optimise}; "
                    f"{first_difference(payload.blobs.get(name, b''), derived)}): altered after compilation, or "
                    "compiled by another Vela version; recompile the program"), None, None
    facts = {"scratch_size": result.scratch_size, "scratch_fast_size": result.scratch_fast_size,
             "command_stream_bytes": len(result.command_stream), "read_only_bytes": len(result.read_only),
             "macs_per_cycle": config.macs * config.cores, "perf": result.perf,
             "io": [{"kind": "input", **io.as_meta()} for io in result.inputs]
                   + [{"kind": "output", **io.as_meta()} for io in result.outputs]}
    io_meta = meta.get("io")
    stated = dict(meta, io=[{k: v for k, v in row.items() if k != "value"} if isinstance(row, dict) else row
                            for row in io_meta] if isinstance(io_meta, list) else io_meta)
    wrong = sorted(k for k, v in facts.items() if _as_json(stated.get(k)) != _as_json(v))
    if wrong:
        return (f"its metadata {', '.join(wrong)} is not what Vela reports for its {GRAPH_BLOB} "
                "(altered after compilation)"), None, None
    return None, result, config
