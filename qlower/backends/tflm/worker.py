"""TFLM's interpreter in a process of its own (started by ``runner``; not imported by qlower).

TFLM is native code that may crash on a model it did not expect and logs to
file descriptor 2. Here a crash ends this process only (the caller raises an
ExecutionError naming the signal), and fd 2 goes to a scratch file whose text
becomes the error message.

Requests (frames of ``frames.py``):
``[b"run", model, arena bytes (decimal), input .npy ...]`` -> ``[b"ok", output .npy ...]``;
``[b"trace", model, arena, names (one a line), input .npy ...]`` -> ``[b"ok", output count, output .npy ...,
the named tensors' .npy ...]`` (every tensor preserved);
``[b"arena", model, upper bound (decimal)]`` -> ``[b"ok", smallest arena (decimal)]``;
any failure -> ``[b"error", message]``. The last interpreter is kept for the next run of the same model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))
from frames import from_npy, load_native, private_pipes, serve, stderr_to_file, to_npy  # noqa: E402

ALIGN = 16          # arena sizes are searched in steps of TFLM's tensor alignment, then to the byte
_START = 1 << 12
_TRACE_LIMIT = 1 << 31


def _runtime():
    from tflite_micro.python.tflite_micro import runtime

    return runtime


def _serve(requests: int, answers: int) -> None:
    runtime = load_native(answers, "TFLM's interpreter (tflite-micro)", _runtime)
    if runtime is None:
        return
    log = stderr_to_file()
    kept: dict = {}

    def interpreter(model: bytes, arena: int):
        key = (model, arena)
        if kept.get("key") != key:
            kept.clear()
            kept["it"] = runtime.Interpreter.from_bytes(model, arena_size=arena)
            kept["key"] = key
        return kept["it"]

    def fits(model: bytes, arena: int, invoke: bool = False, preserve: bool = False) -> bool:
        # in a child: TFLM segfaults on some arenas slightly too small instead of refusing them
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                it = runtime.Interpreter.from_bytes(model, arena_size=arena, intrepreter_config=config(preserve))
                if invoke:
                    # zeros, not what the arena held: an index input must be in range (GATHER refuses)
                    for i in range(_count_inputs(model)):
                        d = it.get_input_details(i)
                        it.set_input(np.zeros(d["shape"], d["dtype"]), i)
                    it.invoke()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    def smallest(model: bytes, upper: int) -> int:
        hi = _START
        while not fits(model, hi):
            if hi >= upper:
                raise RuntimeError(f"the model does not fit an arena of {upper} bytes")
            hi = min(hi * 2, upper)
        lo = 0   # lo never fits, hi always does
        while hi - lo > ALIGN:
            mid = (lo + hi) // 2 // ALIGN * ALIGN
            if mid <= lo:
                break
            lo, hi = (lo, mid) if fits(model, mid) else (mid, hi)
        # then to the byte: the tail is aligned down from the arena's end, so any size may be the least
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(model, mid) else (mid, hi)
        if not fits(model, hi, invoke=True):
            raise RuntimeError(f"the model allocates in an arena of {hi} bytes but does not run in it")
        return hi

    def config(preserve: bool):
        return runtime.InterpreterConfig.kPreserveAllTensors if preserve \
            else runtime.InterpreterConfig.kAllocationRecording

    def trace(model: bytes, arena: int, names: list[str], inputs: list[bytes]) -> list[bytes]:
        # every tensor kept (none shares arena memory), read back by name after the run; the arena
        # that needs is not the device's: grown from ``arena`` until the model allocates
        kept.clear()
        while not fits(model, arena, preserve=True):
            if arena >= _TRACE_LIMIT:
                raise RuntimeError(f"the model does not allocate with all its tensors kept in {arena} bytes")
            arena *= 2
        it = runtime.Interpreter.from_bytes(model, arena_size=arena, intrepreter_config=config(True))
        for i, part in enumerate(inputs):
            it.set_input(from_npy(part), i)
        it.invoke()
        index = _tensor_indices(model)
        outputs = [to_npy(it.get_output(i)) for i in range(len(_count_outputs(model)))]
        seen = [to_npy(it.GetTensor(index[n], 0)["tensor_data"]) for n in names]
        return [b"ok", str(len(outputs)).encode(), *outputs, *seen]

    def handle(frame: list[bytes]) -> list[bytes]:
        log.seek(0)
        log.truncate()
        try:
            if len(frame) >= 3 and frame[0] == b"arena":
                return [b"ok", str(smallest(frame[1], int(frame[2]))).encode()]
            if len(frame) >= 4 and frame[0] == b"trace":
                return trace(frame[1], int(frame[2]), frame[3].decode().split("\n"), frame[4:])
            if len(frame) < 3 or frame[0] != b"run":
                raise ValueError("a request must be [b'run', model, arena, inputs...], [b'trace', model, arena, "
                                 "names, inputs...] or [b'arena', model, upper]")
            it = interpreter(frame[1], int(frame[2]))
            for i, part in enumerate(frame[3:]):
                it.set_input(from_npy(part), i)
            it.invoke()
            n = len(kept.setdefault("outputs", _count_outputs(frame[1])))
            return [b"ok", *(to_npy(it.get_output(i)) for i in range(n))]
        except Exception as e:  # noqa: BLE001 - a refused model or input is the caller's error to raise
            kept.clear()
            log.seek(0)
            return [b"error", f"{type(e).__name__}: {e}".encode() + b"\n" + log.read()[-1500:]]

    serve(requests, answers, handle)


def _count_inputs(model: bytes) -> int:
    from tflite_micro.python.tflite_micro.runtime import schema_fb

    return schema_fb.Model.GetRootAsModel(model, 0).Subgraphs(0).InputsLength()


def _count_outputs(model: bytes) -> list[int]:
    from tflite_micro.python.tflite_micro.runtime import schema_fb

    sg = schema_fb.Model.GetRootAsModel(model, 0).Subgraphs(0)
    return [sg.Outputs(i) for i in range(sg.OutputsLength())]


def _tensor_indices(model: bytes) -> dict[str, int]:
    from tflite_micro.python.tflite_micro.runtime import schema_fb

    sg = schema_fb.Model.GetRootAsModel(model, 0).Subgraphs(0)
    return {sg.Tensors(i).Name().decode(): i for i in range(sg.TensorsLength())}


def main() -> None:
    _serve(*private_pipes())


if __name__ == "__main__":
    main()
