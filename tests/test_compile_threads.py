"""``qlower.compile`` from several threads at once gives what one thread gives (issue 30: torch.export's
dispatch-mode stack is process-wide, so tracing is serialized; the rest runs in parallel)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import qlower
from qlower import zoo
from qlower.ir import print_graph

TARGETS = ("reference", "tosa-1.0+int", "reference", "tosa-1.0+int")


def _compile(target: str, built=None):
    # the zoo seeds torch's global RNG to make its weights: models are built before the threads start
    model, example, quant, calibration = built or zoo.get("tiny_cnn")
    prog = qlower.compile(model, example, target=target, quant=quant, calibration=calibration, progress=False)
    return print_graph(prog.graph), prog.artifacts(), prog.run(*example)


@pytest.mark.slow
def test_four_threads_compile_what_one_thread_compiles():
    expected = {t: _compile(t) for t in set(TARGETS)}
    results: dict[int, object] = {}
    barrier = threading.Barrier(len(TARGETS))
    built = [zoo.get("tiny_cnn") for _ in TARGETS]

    def job(i: int, target: str) -> None:
        barrier.wait()
        try:
            results[i] = _compile(target, built[i])
        except BaseException as e:  # noqa: BLE001 - compared below
            results[i] = e

    threads = [threading.Thread(target=job, args=(i, t)) for i, t in enumerate(TARGETS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for i, target in enumerate(TARGETS):
        got = results[i]
        assert not isinstance(got, BaseException), f"thread {i} ({target}): {got!r}"
        graph, artifacts, outputs = got
        assert graph == expected[target][0]
        assert artifacts == expected[target][1]
        assert all(np.array_equal(a, b) for a, b in zip(outputs, expected[target][2], strict=True))
