"""ExecuTorch's XNNPACK path for ``latency.py``, run in a venv of its own (executorch 1.5.1 and torch 2.13.0;
latency.py makes it on demand). Imports only the model's class from the repository, never qlower's compiler.

    python executorch_xnnpack.py export <module:Class> <state_dict.pt> <calibration.pt> <out.pte>
    python executorch_xnnpack.py serve <model.pte> <input.pt>

``export``: the class built with no arguments, the state dict loaded (weights and BatchNorm statistics), then
ExecuTorch's XNNPACK quantizer (symmetric, per-channel weights, static activations) calibrated on
``calibration.pt`` (a list of input tuples), lowered with the XNNPACK partitioner and written as a .pte.
``serve``: loads the .pte with ExecuTorch's Python runtime and answers lines on stdin, one JSON line each:
``threads N`` (XNNPACK's thread pool resized), ``run N`` (N timed calls: their seconds, wall and the
process's CPU time, every thread's), ``output PATH``
(the output saved with numpy), ``quit``. The caller drives the blocks, so that every runtime it compares is
timed in turn against the same machine load.
"""

from __future__ import annotations

import importlib
import json
import sys
import time


def export(factory: str, state_dict: str, calibration: str, out: str) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    module, name = factory.split(":")
    model = getattr(importlib.import_module(module), name)().eval()
    model.load_state_dict(torch.load(state_dict, weights_only=True))
    batches = [tuple(b) for b in torch.load(calibration, weights_only=True)]
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model, batches[0]).module(), quantizer)
    with torch.no_grad():
        for b in batches:
            prepared(*b)
    quantized = convert_pt2e(prepared)
    lowered = to_edge_transform_and_lower(torch.export.export(quantized, batches[0]),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    with open(out, "wb") as f:
        f.write(lowered.buffer)


def serve(pte: str, inputs: str) -> None:
    import numpy as np
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool

    module = _load_for_executorch(pte)
    x = tuple(torch.load(inputs, weights_only=True))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "threads":
            _unsafe_reset_threadpool(int(arg))
            # the XNNPACK delegate takes the pool when its method is loaded: load again, or it keeps the old one
            module = _load_for_executorch(pte)
            reply = {"threads": int(arg)}
        elif cmd == "run":
            times, cpu = [], []
            for _ in range(int(arg)):
                t, c = time.perf_counter(), time.process_time()
                module.forward(x)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            reply = {"times": times, "cpu": cpu}
        elif cmd == "output":
            np.save(arg, module.forward(x)[0].numpy())
            reply = {"saved": arg}
        elif cmd == "quit":
            return
        else:
            reply = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    {"export": export, "serve": serve}[sys.argv[1]](*sys.argv[2:])
