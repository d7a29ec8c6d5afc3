"""Vela's own process (started by ``vela.compile_tosa`` through a worker pool; not imported by qlower).

Vela's C++ core (regor) segfaults on some graphs and prints through C stdio. Run in the caller's
process, the first takes the caller down and the second needs a process-wide swap of fd 1 and 2
that no other thread can share. Here fd 1 and 2 go to a scratch file whose text is the compile's
log, and a crash only ends this process.

Wire format: the frames of ``frames.py``. A request is ``[b"compile", architecture,
flatbuffer, system config text, options text]``; an answer is ``[b"ok", JSON, command stream,
read-only data]`` or ``[b"error", message, log]``. The JSON holds plain numbers only: the
scratch sizes, the IO tensors, the performance report and Vela's per-operator table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

# This folder is named ethosu, like Vela's namespace package, and a regular package wins over a
# namespace one wherever it is on the path: so nothing of qlower is on it, and the frame protocol
# (shared with the reference model's worker) is loaded from its file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.util.spec_from_file_location("qlower_frames", _HERE.parent / "frames.py")
_frames = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_frames)
serve, private_pipes = _frames.serve, _frames.private_pipes


def _perf(report) -> dict:
    memories = {}
    for name, mem in report.memories.items():
        acc = mem.accesses.values()
        memories[name] = {"peak_bytes": int(mem.peakUsage), "read_bytes": int(sum(a.bytesRead for a in acc)),
                          "write_bytes": int(sum(a.bytesWritten for a in acc)),
                          "access_cycles": int(mem.totalAccessCycles)}
    return {"npu_cycles": int(report.npuCycles), "total_cycles": int(report.totalCycles),
            "macs": int(report.macCount), "npu_ops": int(report.npuOps), "cascades": int(report.cascades),
            "original_weight_bytes": int(report.originalWeights), "encoded_weight_bytes": int(report.encodedWeights),
            "memories": memories}


def _per_layer(db) -> list[dict]:
    """Vela's per-operator estimate (its ``perf`` table, names from the ``source`` table)."""
    def rows(name: str) -> list[dict]:
        t = db.tables.get(name)
        return [dict(zip(t.header, r)) for r in t.data] if t is not None else []

    source_ops = {r["id"]: r["operator"] for r in rows("source")}
    return [{"source_operator": source_ops.get(r.get("source_id"), ""), "operator": r.get("operator", ""),
             "tensor": r.get("name", ""), "op_cycles": int(r.get("op_cycles") or 0),
             "npu_cycles": int(r.get("npu_cycles") or 0), "macs": int(r.get("mac_count") or 0)}
            for r in rows("perf")]


def _io(tensors) -> list[dict]:
    return [{"shape": [int(d) for d in t.shape], "element_size": int(t.element_size), "size": int(t.size),
             "region": int(t.region), "address": int(t.address)} for t in tensors]


def _compile(regor, frame: list[bytes]) -> list[bytes]:
    arch, buf, sysconfig, options = frame[1].decode(), frame[2], frame[3].decode(), frame[4].decode()
    cm = regor.compile(arch, buf, "TOSA", sysconfig, options=options, verbose=False)
    if cm is None:
        raise RuntimeError("")   # no model and no exception: the log says why
    if not isinstance(cm, regor.CompiledRawModel):
        raise TypeError(f"Vela returned {type(cm).__name__}, expected a raw command stream")
    per_layer = "enable_db=true" in options
    meta = {"scratch": int(cm.scratch.size), "scratch_fast": int(cm.scratch_fast.size),
            "inputs": _io(cm.inputs), "outputs": _io(cm.outputs), "perf": _perf(cm.perf_report),
            "per_layer": _per_layer(cm.opt_database) if per_layer else None}
    return [b"ok", json.dumps(meta).encode(), bytes(cm.command_stream), bytes(cm.read_only.data)]


def _serve(requests: int, answers: int) -> None:
    try:
        from ethosu import regor
    except Exception as e:  # noqa: BLE001 - each request gets the reason, the caller raises it
        regor, missing = None, f"can't import Vela: {e}".encode()
    log = tempfile.TemporaryFile()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)

    def handle(frame: list[bytes]) -> list[bytes]:
        log.seek(0)
        log.truncate()
        try:
            if len(frame) != 5 or frame[0] != b"compile":
                raise ValueError("a request must be [b'compile', architecture, flatbuffer, system config, options]")
            if regor is None:
                raise ImportError(missing.decode())
            return _compile(regor, frame)
        except Exception as e:  # noqa: BLE001 - Vela's rejection is the caller's error to raise
            sys.stdout.flush()
            log.seek(0)
            return [b"error", str(e).encode(errors="replace"), log.read()]

    serve(requests, answers, handle)


def main() -> None:
    _serve(*private_pipes(silence=False))   # Vela's own output is captured per request


if __name__ == "__main__":
    main()
