"""CpuPlan behaviour: input checking, tracing, threads, outputs, delegate calls, the backend plug-in."""

import dataclasses

import numpy as np
import pytest
import torch

from qlower.backends.cpu import CpuBackend, prepare
from qlower.errors import InputError, UnsupportedOpError
from qlower.ir import OPS, DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.reference import run_graph
from qlower.testing import programs
from qlower.testing.cpu_checks import assert_cpu_matches_reference
from qlower.testing.graph_checks import random_inputs


def small_graph():
    b = GraphBuilder("small")
    x = b.input("image", TensorType((1, 4, 4, 3), DType.INT8, QuantSpec.per_tensor(0.1, 2)))
    f = b.input("features", TensorType((2, 5), DType.FLOAT32))
    w = b.constant(np.arange(-18, 18, dtype=np.int8).reshape(2, 3, 2, 3), QuantSpec.per_tensor(0.01), name="w")
    y = b.op("rescale", b.op("conv2d", x, w, None), out=QuantSpec.per_tensor(0.05, 0))
    return verify_graph(b.build([y, b.op("tanh", f), w]))


@pytest.mark.parametrize("name,make", [("conv", programs.conv_graph), ("movement", programs.movement_graph),
                                       ("dynamic", programs.dynamic_graph)])
def test_sample_programs_using_every_op_kind(name, make):
    graph = make()
    assert_cpu_matches_reference(graph, random_inputs(graph, 7))


def test_input_errors_name_the_input_and_the_expected_shape():
    plan = prepare(small_graph())
    good = random_inputs(plan.graph, 0)
    with pytest.raises(InputError, match="takes 2 input"):
        plan.run(good[:1])
    with pytest.raises(InputError, match=r"%image.*\(1, 4, 4, 3\)"):
        plan.run([np.zeros((1, 3, 4, 4), np.int8), good[1]])
    with pytest.raises(InputError, match=r"%image.*int8"):
        plan.run([good[0].astype(np.int32), good[1]])
    with pytest.raises(InputError, match=r"%features.*\(2, 5\)"):
        plan.run_traced([good[0], np.zeros((5, 2), np.float32)])
    out = plan.run([good[0], good[1].astype(np.float64)])  # float inputs are converted, like the reference
    np.testing.assert_array_equal(out[0], run_graph(plan.graph, good)[0])


def test_outputs_are_private_copies():
    graph = small_graph()
    plan = prepare(graph)
    inputs = random_inputs(graph, 1)
    first = plan.run(inputs)
    for array in first:
        array[...] = 0  # must not reach the plan's constants or any later run
    for e, g in zip(run_graph(graph, inputs), plan.run(inputs)):
        np.testing.assert_array_equal(g, e)


def test_run_traced_has_every_value_op_by_op():
    graph = small_graph()
    plan = prepare(graph)
    traced = plan.run_traced(random_inputs(graph, 2), each_op=True)
    assert set(traced) == {v.name for v in graph.values()}


def test_run_traced_runs_the_fused_steps_that_run_runs():
    """Verification must measure what ``run`` executes: the fused kernels, whose inner values
    never exist (so they are absent from the trace), not the op-by-op kernels."""
    graph = small_graph()
    plan = prepare(graph)
    assert plan.fused, "the sample graph must have a fused chain for this test to mean anything"
    inputs = random_inputs(graph, 2)
    calls = []
    for i, step in enumerate(plan._fused_steps):
        def spy(*args, _kernel=step.kernel, _i=i):
            calls.append(_i)
            return _kernel(*args)
        plan._fused_steps[i] = dataclasses.replace(step, kernel=spy)
    traced = plan.run_traced(inputs)
    assert calls == list(range(len(plan._fused_steps)))
    inner = {v.name for g in plan._fused_steps if len(g.ops) > 1 for op in g.ops[:-1] for v in op.results}
    assert inner and not inner & set(traced)
    _, env = run_graph(graph, inputs, keep_all=True)
    for v, expected in env.items():
        if v.name in traced:
            np.testing.assert_array_equal(traced[v.name], expected)


def test_threads_apply_to_the_run_only():
    graph = small_graph()
    before = torch.get_num_threads()
    plan = prepare(graph, threads=1)
    seen = []
    original = plan._steps[0].kernel

    def spy(*args):
        seen.append(torch.get_num_threads())
        return original(*args)
    plan._steps[0] = dataclasses.replace(plan._steps[0], kernel=spy)
    plan.run(random_inputs(graph, 3))
    assert seen == [1] and torch.get_num_threads() == before


def test_delegate_calls_need_an_executor_and_use_it():
    program = programs.partitioned_program(programs.conv_graph())
    host = program.graph
    assert any(op.kind == "delegate" for op in host.ops)
    with pytest.raises(UnsupportedOpError, match="needs an executor"):
        prepare(host)
    backend = programs.BlobBackend()
    executors = {p.name: (lambda xs, p=p: backend.execute(p.payload, xs)) for p in program.partitions}
    inputs = random_inputs(program.source, 4)
    got = prepare(host, delegates=executors).run(inputs)
    for e, g in zip(run_graph(program.source, inputs), got):
        np.testing.assert_array_equal(g, e)


def test_backend_supports_every_kind_but_delegate():
    backend = CpuBackend()
    graph = programs.movement_graph()
    op = next(op for op in graph.ops if op.kind == "concat")
    assert backend.supports(op, "cpu")
    assert not backend.supports(op, "tosa-1.0+int")
    kinds = {op.kind for g in (programs.conv_graph(), programs.movement_graph(), programs.dynamic_graph())
             for op in g.ops}
    assert kinds == set(OPS) - {"delegate"}  # the sample programs cover the registry
    for g in (programs.conv_graph(), programs.movement_graph(), programs.dynamic_graph()):
        assert all(backend.supports(op, "cpu") for op in g.ops)
    host = programs.partitioned_program(programs.conv_graph()).graph
    verdict = backend.supports(next(op for op in host.ops if op.kind == "delegate"), "cpu")
    assert not verdict and "delegate" in verdict.reason
    with pytest.raises(NotImplementedError, match="prepare"):
        backend.lower(graph, "cpu")
