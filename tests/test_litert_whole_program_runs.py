"""A program that is one partition runs straight on its backend (qlower/runtime/runner.py), with the host
plan's checks and none of its costs: the same numbers as through the plan, inputs checked and never
written, outputs the caller's own; and LiteRT's NaN/infinity check, made on its own input buffer, refuses
a non-finite value wherever it is and leaves the next run exact. A host plan whose every step is a
delegate call leaves torch's process-wide thread count alone (setting it reshapes OpenMP's pool)."""

import numpy as np
import pytest
import torch

import qlower
from qlower.backends.cpu import prepare
from qlower.errors import InputError
from qlower.reference import run_graph
from qlower.runtime.runner import Runner

SEED = 20261127


def _program(kernels: str = "xnnpack", threads: int = 1):
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 8 * 8, 4)).eval()
    gen = torch.Generator().manual_seed(SEED)
    example = (torch.randn(1, 3, 8, 8, generator=gen),)
    calibration = [(torch.randn(1, 3, 8, 8, generator=gen),) for _ in range(4)]
    return qlower.compile(model, example, target="litert", calibration=calibration, progress=False,
                          backend_options={"kernels": kernels, "threads": threads})


@pytest.fixture(scope="module")
def prog():
    return _program()


def test_a_one_partition_program_skips_the_plan_and_computes_what_the_plan_does(prog):
    runner = prog.runner()
    assert isinstance(runner, Runner) and runner._whole is prog.partitions[0]
    rng = np.random.default_rng(SEED)
    for _ in range(3):
        x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 3
        kept = x.copy()
        direct = prog.run(x)
        through_plan = runner._cpu_plan().run([x])
        want = run_graph(prog.source, [x])
        for d, p, w in zip(direct, through_plan, want):
            assert d.dtype == w.dtype and d.shape == w.shape
            np.testing.assert_array_equal(d, w)
            np.testing.assert_array_equal(p, w)
        np.testing.assert_array_equal(x, kept)            # the input is read, never written
        direct[0][...] = 0                               # the output is the caller's: the next run is whole
        np.testing.assert_array_equal(prog.run(x)[0], want[0])


def test_its_inputs_are_checked_as_the_plan_checks_them(prog):
    with pytest.raises(InputError, match=r"input 0 \(%\w+\) has shape \(1, 3, 9, 8\), expected \(1, 3, 8, 8\)"):
        prog.run(np.zeros((1, 3, 9, 8), np.float32))
    with pytest.raises(InputError, match="takes 1 input"):
        prog.run(np.zeros((1, 3, 8, 8), np.float32), np.zeros((1, 3, 8, 8), np.float32))
    want = run_graph(prog.source, [np.ones((1, 3, 8, 8), np.float32)])[0]
    np.testing.assert_array_equal(prog.run(np.ones((1, 3, 8, 8), np.float64))[0], want)   # float64 converted


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_litert_refuses_a_non_finite_input_anywhere_and_the_next_run_is_exact(prog, bad):
    x = np.random.default_rng(SEED).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = run_graph(prog.source, [x])[0]
    for where in (0, x.size // 2, x.size - 1):
        y = x.copy()
        y.flat[where] = bad
        with pytest.raises(InputError, match="NaN or infinity"):
            prog.run(y)
        np.testing.assert_array_equal(prog.run(x)[0], want)


def test_a_plan_of_delegate_calls_only_leaves_torchs_thread_count_alone(prog, monkeypatch):
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    part = prog.partitions[0]
    runner = Runner(prog.graph, prog.partitions, {part.backend: prog.runner().backends[part.backend]},
                    threads=wanted)
    x = np.zeros((1, 3, 8, 8), np.float32)
    runner._cpu_plan().run([x])
    assert calls == []
    # a plan with a host step takes the run's count and gives the process's back
    from qlower.ir import DType, GraphBuilder, TensorType
    b = GraphBuilder("host")
    v = b.input("v", TensorType((4,), DType.FLOAT32))
    plan = prepare(b.build([b.op("maximum", v, b.constant(np.zeros(4, np.float32)))]), threads=wanted)
    np.testing.assert_array_equal(plan.run([np.array([-1, 0, 2, -3], np.float32)])[0], [0, 0, 2, 0])
    assert calls == [wanted, before] and torch.get_num_threads() == before


@pytest.mark.parametrize("native_kernels", [True, False])
def test_the_input_fill_copies_and_finds_every_non_finite_value(monkeypatch, native_kernels):
    """The fused copy-and-check (native) and its fallback: the copy is bit for bit, and NaN (any payload or
    sign), +-infinity anywhere, the vector tail included, is found; the largest finite values, subnormals and
    -0.0 are not."""
    from qlower.backends.cpu import native
    from qlower.backends.litert.backend import _fill

    if native_kernels:
        assert native.load() is not None, native.unavailable_reason()
    else:
        monkeypatch.setattr(native, "load", lambda: None)
    rng = np.random.default_rng(SEED)
    edge = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal,
                     -0.0], np.float32)
    odd_nan = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001], np.uint32).view(np.float32)
    for n in (1, 15, 16, 17, 1000, 150531):
        x = rng.standard_normal(n).astype(np.float32) * 1e3
        x[rng.integers(0, n, min(n, 4))] = edge[:min(n, 4)]
        buffer = np.full(n, 7.0, np.float32)
        assert _fill(buffer, x) is True
        np.testing.assert_array_equal(buffer.view(np.uint32), x.view(np.uint32))
        for bad in (np.inf, -np.inf, np.nan, *odd_nan):
            for where in {0, n // 2, n - 1}:
                y = x.copy()
                y[where] = bad
                assert _fill(np.empty(n, np.float32), y) is False, (n, where, bad)
