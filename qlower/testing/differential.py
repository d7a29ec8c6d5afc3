"""Differential checks: a graph run on a backend target against the reference interpreter.

``check_against_reference(graph, inputs, target)`` runs the graph the way a program on that
target runs it (``qlower.api.lower_graph(graph, target).run``) and compares every
output with ``qlower.reference.run_graph`` on the program's form of the graph (its backend's
declared rewrites of it), and that form with the original graph, op by op, within the
rewrites' declared bounds:

- ``cpu``: the whole graph in the CPU backend's plan;
- ``tosa-1.0+int``, ``tosa-1.0+int+fp``, ``ethos-u*``: partitioned, host ops in the host
  executor and partitions on the backend (Ethos-U partitions are compiled by Vela and
  simulated on the TOSA reference model);
- ``vgf+int``, ``vgf``: the same, with partitions converted to VGF and run for real by the
  ML SDK scenario runner on Vulkan (never the simulated fallback).

Tolerances (``output_tolerances``), per output, from the ops it depends on; an
element passes when ``|got - want| <= rtol * max(|want|, floor * max|want|) + atol``:
- integer outputs, and float outputs computed only by exact ops (quantize,
  dequantize, float add/mul, data movement), must be bit-identical;
- float outputs of a dynamic quantization chain: ``DYNAMIC``, 1e-5 relative (DESIGN.md's
  contract), measured against at least 1/1000 of the tensor's largest value, since a
  float bias add may cancel the product it is added to;
- float outputs of approximate float ops (sigmoid, tanh, exp, erf, reciprocal,
  softmax), which TOSA-1.0+INT+FP computes in float32 where the reference rounds a
  float64 result once: ``FLOAT_OPS``, 1e-5 relative plus 1e-6 absolute. Measured on the
  TOSA reference model (N(0, sigma) inputs, sigma 0.01..30): sigmoid, exp, erf within
  2 ulp; softmax within 35 ulp (2.1e-6 relative); tanh within 1.2e-5 relative but, near
  0, with an absolute error of up to 2**-22 (it goes through exp), which the absolute
  term covers.

A failing case is saved with ``save_counterexample`` (a program file holding the
graph, plus a ``.npz`` of the inputs; no pickle) and replayed with
``load_counterexample``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qlower.ir import Graph
from qlower.reference import run_graph

# both Ethos-U families: Vela (and what it accepts) differs between U55 and U85
TARGETS = ("tosa-1.0+int", "tosa-1.0+int+fp", "cpu", "ethos-u85-256", "ethos-u55-128", "vgf+int", "vgf",
           "litert")


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 0.0
    atol: float = 0.0
    floor: float = 0.0

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0

    def __or__(self, other: Tolerance) -> Tolerance:
        return Tolerance(max(self.rtol, other.rtol), max(self.atol, other.atol), max(self.floor, other.floor))

    def __str__(self) -> str:
        return "bit-exact" if self.exact else f"rtol {self.rtol:g}, atol {self.atol:g}, floor {self.floor:g}"


EXACT = Tolerance()
DYNAMIC = Tolerance(rtol=1e-5, floor=1e-3)
FLOAT_OPS = Tolerance(rtol=1e-5, atol=1e-6)
APPROXIMATE_OPS = frozenset({"sigmoid", "tanh", "exp", "erf", "reciprocal", "softmax"})


class DifferentialMismatch(AssertionError):
    """A backend's outputs differ from the reference interpreter's."""


def available_targets() -> list[str]:
    """The targets of ``TARGETS`` whose backend (and its tools) can run here."""
    def have(*modules: str) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in modules)

    out = []
    for t in TARGETS:
        if t.startswith("tosa") and have("qlower.backends.tosa", "tosa_reference_model", "tosa_serializer"):
            out.append(t)
        elif t == "cpu" and have("qlower.backends.cpu"):
            out.append(t)
        elif t.startswith("ethos-u") and have("qlower.backends.ethosu", "ethosu.regor", "tosa_reference_model"):
            out.append(t)
        elif t.startswith("vgf") and have("qlower.backends.vgf", "vgfpy", "tosa_serializer"):
            out.append(t)
        elif t == "litert" and have("qlower.backends.litert", "ai_edge_litert", "tflite"):
            out.append(t)
    return out


def program_meaning(graph: Graph, target: str) -> Graph:
    """The form a program compiled for ``target`` from ``graph`` has: its backend's rewrites of the
    graph (LiteRT gives fused rescales its reference kernels' rounding). The target must reproduce
    the reference interpreter on this form exactly; the form must be within its rewrites' declared
    bounds of ``graph`` (``check_against_reference``)."""
    backend = _backend(target)
    return graph if backend is None else backend.rewrite(graph, target)


@functools.cache
def _backend(target: str):
    from qlower.backends.registry import backend_for

    return backend_for(target) if target != "reference" else None


def _options(target: str) -> dict | None:
    # VGF runs on Vulkan (never simulated here): a machine that can't is a failure, not a pass
    return {"execution": "vulkan"} if target.startswith("vgf") else None


def run_target(graph: Graph, inputs: Sequence[np.ndarray], target: str) -> list[np.ndarray]:
    """Run ``graph`` as a program compiled for ``target`` runs it."""
    if target == "reference":
        return run_graph(graph, inputs)
    from qlower.api import lower_graph

    return lower_graph(graph, target, backend_options=_options(target)).run(*inputs)


def output_tolerances(graph: Graph) -> list[Tolerance]:
    """The tolerance of each output, from the ops it depends on (see the module docstring)."""
    tol: dict[object, Tolerance] = {}
    for op in graph.ops:
        t = EXACT
        for v in op.input_values():
            t = t | tol.get(v, EXACT)
        if op.kind == "dynamic_quantize":
            t = t | DYNAMIC
        elif op.kind in APPROXIMATE_OPS:
            t = t | FLOAT_OPS
        for r in op.results:
            tol[r] = t
    return [tol.get(v, EXACT) if v.dtype.is_float else EXACT for v in graph.outputs]


def _difference(want: np.ndarray, got: np.ndarray, tol: Tolerance) -> str | None:
    """None when ``got`` matches ``want`` within ``tol``, else what differs."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if tol.exact:
        if np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes():
            return None
        bad = ~((got == want) | (np.isnan(got) & np.isnan(want))) if want.dtype.kind == "f" else got != want
    else:
        w, g = want.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(w)
        scale = np.maximum(np.abs(w), tol.floor * np.abs(w[finite]).max(initial=0.0))
        with np.errstate(invalid="ignore"):
            close = np.abs(g - w) <= tol.rtol * scale + tol.atol
        bad = ~np.where(finite, close, (g == w) | (np.isnan(g) & np.isnan(w)))
    idx = np.argwhere(bad)
    if not len(idx):
        return None
    first = tuple(int(i) for i in idx[0])
    detail = (f"{len(idx)} of {want.size} element(s) differ, first at {first}: got {got[first]!r}, "
              f"expected {want[first]!r}")
    if want.dtype.kind in "iu":
        detail += f"; max |difference| {int(np.abs(got.astype(np.int64) - want.astype(np.int64)).max())}"
    return f"{detail} ({tol})"


def check_against_reference(graph: Graph, inputs: Sequence[np.ndarray], target: str) -> None:
    """Raise DifferentialMismatch unless ``target`` reproduces the reference's outputs on its own
    form of ``graph`` (its backend's rewrites of it; within the tolerances above) and that form is
    within its rewrites' declared bounds of ``graph`` itself, op by op with each op's inputs forced
    to ``graph``'s codes (``qlower.reference.forms``; every value no rewrite names: exact).

    Any error of the backend (CompileError, ExecutionError, or a crash) on a graph the
    reference runs is a mismatch too: it is raised as a DifferentialMismatch naming the target.
    """
    if target == "reference":
        return
    from qlower.api import lower_graph

    try:
        program = lower_graph(graph, target, backend_options=_options(target))
        got = program.run(*inputs)
    except Exception as e:  # noqa: BLE001 - whatever the backend raises is the finding
        raise DifferentialMismatch(f"{target} failed on a graph the reference runs: "
                                   f"{type(e).__name__}: {e}") from e
    form = program.source
    want = run_graph(form, inputs)
    if len(got) != len(want):
        raise DifferentialMismatch(f"{target} returned {len(got)} outputs, the reference {len(want)}")
    problems = []
    for i, (w, g, tol) in enumerate(zip(want, got, output_tolerances(form))):
        diff = _difference(w, np.asarray(g), tol)
        if diff is not None:
            problems.append(f"output {i} (%{form.outputs[i].name}): {diff}")
    if form is not graph:
        from qlower.reference.forms import declared_bounds, form_steps

        for r in form_steps(graph, form, inputs, declared_bounds(program.rewrites)):
            if not r.within:
                declared = f"declared {r.bound} by {', '.join(r.rewrites)}" if r.rewrites else "declared exact"
                problems.append(f"%{r.name}: {target}'s form is {r.steps:g} steps from the original graph with "
                                f"its inputs forced to the original codes ({declared})")
    if problems:
        raise DifferentialMismatch(f"{target} differs from the reference interpreter:\n  " + "\n  ".join(problems))


# -- counter-examples --------------------------------------------------------------------

def _program_bytes(graph: Graph, meta: dict) -> bytes:
    from qlower.program.fileformat import program_to_bytes
    from qlower.program.program import Program

    return program_to_bytes(Program(target="reference", graph=graph, source=graph, meta=meta))


def save_counterexample(graph: Graph, inputs: Sequence[np.ndarray], target: str, message: str,
                        directory: str | Path) -> Path:
    """Write ``<hash>.qlp`` (the graph as a program file, the failure in its meta) and
    ``<hash>.npz`` (the inputs) to ``directory``; returns the ``.qlp`` path. The hash names
    the graph and the inputs, so saving the same case again rewrites the same files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"input_{i}": np.ascontiguousarray(x) for i, x in enumerate(inputs)}
    h = hashlib.sha256(_program_bytes(graph, {}))
    for x in arrays.values():
        h.update(str((x.dtype.str, x.shape)).encode() + x.tobytes())
    stem = directory / h.hexdigest()[:16]
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    stem.with_suffix(".npz").write_bytes(buf.getvalue())
    meta = {"fuzz": {"target": target, "failure": message[:4000]}}
    stem.with_suffix(".qlp").write_bytes(_program_bytes(graph, meta))
    return stem.with_suffix(".qlp")


def load_counterexample(path: str | Path) -> tuple[Graph, list[np.ndarray], dict]:
    """The graph, inputs and ``meta["fuzz"]`` of a case written by ``save_counterexample``."""
    from qlower.program.fileformat import program_from_bytes

    path = Path(path)
    program = program_from_bytes(path.read_bytes(), name=path.name)
    with np.load(path.with_suffix(".npz"), allow_pickle=False) as data:
        n = len(data.files)
        inputs = [data[f"input_{i}"] for i in range(n)]
    return program.source, inputs, dict(program.meta.get("fuzz", {}))


# -- in a hypothesis test --------------------------------------------------------------------

@dataclass(frozen=True)
class KnownIssue:
    """A backend bug the fuzzer found that is not fixed yet (``tests/regressions/known_issues.json``):
    a failure on ``target`` whose message matches ``pattern`` (a regular expression), shown by
    the saved ``cases`` (file stems)."""

    target: str
    pattern: str
    cases: tuple[str, ...]
    what: str

    def matches(self, target: str, message: str) -> bool:
        return target == self.target and re.search(self.pattern, message) is not None


def load_known_issues(path: str | Path) -> list[KnownIssue]:
    path = Path(path)
    if not path.exists():
        return []
    return [KnownIssue(d["target"], d["pattern"], tuple(d["cases"]), d["what"])
            for d in json.loads(path.read_text())["issues"]]


def _final_example() -> bool:
    """True in hypothesis's final replay of a (shrunk) failing example, and outside hypothesis."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        return current_build_context().is_final
    except InvalidArgument:
        return True


def fuzz_check(graph: Graph, inputs: Sequence[np.ndarray], target: str, save_dir: str | Path | None,
               known: Sequence[KnownIssue] = ()) -> None:
    """``check_against_reference`` inside a hypothesis test.

    A mismatch matching a known issue rejects the example (``hypothesis.reject``): that bug
    is tracked by its saved case. Any other mismatch fails the test; in the final replay of
    the shrunk example the case is first saved to ``save_dir`` (when given) and the error
    notes the file, so that it can become a regression test (tests/test_fuzz_regressions.py).
    """
    try:
        check_against_reference(graph, inputs, target)
    except DifferentialMismatch as e:
        if any(k.matches(target, str(e)) for k in known):
            from hypothesis import reject

            reject()
        if save_dir is not None and _final_example():
            path = save_counterexample(graph, inputs, target, str(e), save_dir)
            e.add_note(f"counter-example saved as {path} (with {path.with_suffix('.npz').name}); "
                       "replayed by tests/test_fuzz_regressions.py")
        raise
