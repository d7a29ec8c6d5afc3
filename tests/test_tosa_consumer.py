"""A new TOSA-consuming accelerator is one small subclass of TosaConsumer.

``EchoNpu`` "compiles" the TOSA graph into a command stream that is just its bytes reversed:
what its backend writes is the lowering, the wrapping, the simulated execution, the per-layer
trace and the load checks, all inherited. Each must behave like Ethos-U's and VGF's.
"""

from __future__ import annotations

import numpy as np
import pytest

from qlower.backends.tosa.backend import GRAPH_BLOB
from qlower.backends.tosa.consumer import TosaConsumer, simulated
from qlower.backends.tosa.tensors import tosa_meta
from qlower.contract import Execution, Payload, Verdict
from qlower.errors import ExecutionError
from qlower.ir import DType, Graph, GraphBuilder, Op, QuantSpec, TensorType, verify_graph
from qlower.partition import partition
from qlower.reference import run_graph


class EchoNpu(TosaConsumer):
    name = "echo-npu"
    title = "Echo NPU"
    targets = ("echo-npu",)
    compiler_blobs = ("commands.bin",)

    def tosa_profile(self, target: str) -> str:
        return "tosa-1.0+int"

    def supports(self, op: Op, target: str) -> Verdict:
        return self.tosa.supports(op, self.tosa_profile(target))

    def lower(self, subgraph: Graph, target: str, trace: bool = False) -> Payload:
        tosa = self.tosa.lower(subgraph, self.tosa_profile(target), trace=trace)
        return self.wrap(target, tosa, {"commands.bin": tosa.blobs[GRAPH_BLOB][::-1]}, tosa.input_types,
                         tosa.output_types, {"execution": str(simulated())})


def _graph() -> Graph:
    b = GraphBuilder("echo")
    q = QuantSpec.per_tensor(0.05, 3)
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, q))
    y = b.op("clamp", b.op("max_pool2d", x, kernel=(2, 2), stride=(2, 2)), min=-20, max=90, name="y")
    return verify_graph(b.build([b.op("rescale", y, out=QuantSpec.per_tensor(0.1, -2), name="out")]))


@pytest.fixture(scope="module")
def lowered():
    graph = _graph()
    result = partition(graph, EchoNpu(), "echo-npu", trace=True)
    (part,) = result.partitions
    return graph, result, part


def test_the_subclass_lowers_wraps_and_runs_simulated(lowered):
    graph, _, part = lowered
    payload = part.payload
    assert set(payload.blobs) == {"graph.tosa", "trace.tosa", "commands.bin"}
    assert payload.blobs["commands.bin"] == payload.blobs["graph.tosa"][::-1]
    assert payload.execution == Execution("simulated", "TOSA reference model")
    assert tosa_meta(payload)["profile"] == "TOSA-1.0+INT" and payload.check() is None
    x = np.random.default_rng(0).integers(-128, 128, (1, 6, 6, 4)).astype(np.int8)
    want = run_graph(graph, [x])
    np.testing.assert_array_equal(EchoNpu().execute(payload, [x])[0], want[0])
    traced = EchoNpu().execute_traced(payload, [x], list(payload.tensor_map))
    by_value = {payload.tensor_map[k]: v for k, v in traced.items()}
    _, env = run_graph(graph, [x], keep_all=True)
    reference = {v.name: a for v, a in env.items()}
    assert {"y", "out"} <= set(by_value)
    for name, value in by_value.items():
        np.testing.assert_array_equal(value, reference[name])


def test_load_checks_are_inherited(lowered):
    graph, _, part = lowered
    backend, payload = EchoNpu(), part.payload
    assert backend.check_loaded(part.subgraph, payload) is None
    without = Payload(payload.backend, payload.target, {k: v for k, v in payload.blobs.items() if k != "commands.bin"},
                      payload.input_types, payload.output_types, payload.tensor_map, payload.meta)
    assert backend.check_loaded(part.subgraph, without) == "the Echo NPU payload has no commands.bin"
    flipped = bytearray(payload.blobs["graph.tosa"])
    flipped[len(flipped) // 2] ^= 0xFF
    altered = Payload(payload.backend, payload.target, {**payload.blobs, "graph.tosa": bytes(flipped)},
                      payload.input_types, payload.output_types, payload.tensor_map, payload.meta)
    assert "graph.tosa is not what qlower writes" in backend.check_loaded(part.subgraph, altered)
    no_tosa = Payload(payload.backend, payload.target, {"commands.bin": b""}, payload.input_types,
                      payload.output_types, payload.tensor_map, payload.meta)
    with pytest.raises(ExecutionError, match="Echo NPU payload for echo-npu has no graph.tosa"):
        backend.execute(no_tosa, [np.zeros((1, 6, 6, 4), np.int8)])
