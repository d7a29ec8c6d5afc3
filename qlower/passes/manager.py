"""Running graph passes: in order, optionally to a fixpoint, checked after each one.

A pass is any callable ``Graph -> PassResult`` with a name (its ``name``
attribute, else its ``__name__``). Passes never edit values: they return a new
graph (or the same graph object when they changed nothing).

Guarantees of ``PassManager``:

* With ``verify=True`` the verifier (``qlower.ir.verify_graph``) runs on the input
  graph and after every pass, and the graph's signature (its input and output
  types) must be unchanged. A failure is a ``VerificationError`` that names the
  pass that broke the graph and every pass that ran before it.
* With ``verify=False`` the same checks run once, on the final graph, so a
  broken graph never leaves the manager; the message then says to rerun with
  verification on (``--verify-passes``) to find the culprit.
* Every pass run is recorded (``records``): name, iteration, whether it changed
  the graph, time taken, op counts before and after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from qlower.errors import VerificationError
from qlower.ir import Graph, verify_graph


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the resulting graph and whether it differs from the input."""

    graph: Graph
    changed: bool


Pass = Callable[[Graph], PassResult]


def pass_name(p: Pass) -> str:
    return getattr(p, "name", None) or getattr(p, "__name__", None) or type(p).__name__


@dataclass(frozen=True)
class PassRecord:
    """One run of one pass."""

    name: str
    iteration: int
    changed: bool
    seconds: float
    ops_before: int
    ops_after: int


def _signature(graph: Graph) -> tuple[tuple, tuple]:
    return tuple(v.type for v in graph.inputs), tuple(v.type for v in graph.outputs)


@dataclass
class PassManager:
    """Runs ``passes`` in order; repeats the whole list until no pass changes the graph,
    at most ``max_iterations`` times (1: a single sweep)."""

    passes: Sequence[Pass]
    verify: bool = True
    max_iterations: int = 1
    records: list[PassRecord] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError(f"max_iterations must be at least 1, got {self.max_iterations}")
        self.passes = list(self.passes)

    def __call__(self, graph: Graph) -> PassResult:
        self.records = []
        signature = _signature(graph)
        if self.verify:
            self._check(graph, signature, "the input graph, before any pass ran")
        ran: list[str] = []
        any_change = False
        for iteration in range(1, self.max_iterations + 1):
            changed_this_iteration = False
            for p in self.passes:
                graph, changed = self._run_one(p, graph, iteration, ran)
                ran.append(pass_name(p))
                if changed:
                    changed_this_iteration = any_change = True
                    if self.verify:
                        self._check(graph, signature, self._culprit(ran, iteration))
            if not changed_this_iteration:
                break
        if not self.verify:
            self._check(graph, signature, f"the pipeline ({', '.join(ran)}); rerun with verify=True "
                                          "(--verify-passes) to find the pass that broke it")
        return PassResult(graph, any_change)

    def run(self, graph: Graph) -> Graph:
        """``self(graph).graph``: the transformed graph alone."""
        return self(graph).graph

    def _run_one(self, p: Pass, graph: Graph, iteration: int, ran: list[str]) -> tuple[Graph, bool]:
        name = pass_name(p)
        start = time.perf_counter()
        try:
            result = p(graph)
        except Exception as e:
            e.add_note(f"raised by pass '{name}' (iteration {iteration}); passes run before it: "
                       f"{', '.join(ran) or 'none'}")
            raise
        seconds = time.perf_counter() - start
        if not isinstance(result, PassResult):
            raise VerificationError(f"pass '{name}' returned {type(result).__name__}, not a PassResult")
        self.records.append(PassRecord(name, iteration, result.changed, seconds,
                                       len(graph.ops), len(result.graph.ops)))
        if not result.changed and result.graph is not graph and self.verify:
            # A pass that says "unchanged" must not have altered the graph's meaning either.
            self._check(result.graph, _signature(graph), self._culprit([*ran, name], iteration))
        return result.graph, result.changed

    @staticmethod
    def _culprit(ran: list[str], iteration: int) -> str:
        before = ", ".join(ran[:-1]) or "none"
        return f"pass '{ran[-1]}' (iteration {iteration}); passes run before it: {before}"

    @staticmethod
    def _check(graph: Graph, signature: tuple[tuple, tuple], after: str) -> None:
        try:
            verify_graph(graph)
        except VerificationError as e:
            raise VerificationError(f"graph '{graph.name}' is invalid after {after}.\n{e}") from None
        if _signature(graph) != signature:
            (ins, outs), (new_ins, new_outs) = signature, _signature(graph)
            raise VerificationError(
                f"graph '{graph.name}' changed its signature after {after}: inputs "
                f"{[str(t) for t in ins]} -> {[str(t) for t in new_ins]}, outputs "
                f"{[str(t) for t in outs]} -> {[str(t) for t in new_outs]}. A pass must keep the "
                "types of the graph's inputs and outputs.")

    def format_records(self) -> str:
        """A table of the last run, for ``--verbose`` style reports."""
        lines = [f"{'pass':<24} {'iter':>4} {'changed':>7} {'ms':>9} {'ops':>11}"]
        for r in self.records:
            lines.append(f"{r.name:<24} {r.iteration:>4} {'yes' if r.changed else 'no':>7} "
                         f"{r.seconds * 1e3:>9.2f} {r.ops_before:>5}->{r.ops_after:<5}")
        return "\n".join(lines)
