"""A backend's rewrite of a graph: named, with a declared bound against the graph it received.

A backend may give a program another form than the canonical one (the graph before backend
rewrites, which the ``reference`` target computes): a kernel family's rounding, a cheaper mean,
an interpolated table (DESIGN.md rule 10). Each such change is a ``Rewrite``: a name, a bound
and ``apply(graph) -> Rewritten``. The bound is declared per rewritten op:

- ``steps == 0`` (*exact*): every value of the received graph that the result still has (same
  name, same type) keeps its codes on every input: layout, widening, copies;
- ``steps == k``: the values ``Rewritten.values`` names may each be up to ``k`` steps from the
  received graph's, *with their inputs forced to the received graph's codes* (the op alone: end
  to end, a later op may carry a one-step difference further), and every other value the
  result shares with the received graph keeps its codes under the same forcing.

``qlower.reference.forms`` checks a declaration with the reference interpreter (the property
tests, verification and the differential fuzzer all use it). ``apply_rewrites`` runs a
backend's rewrites in order and verifies the IR after each; a rewrite that cannot meet its
declaration on a graph must leave that part of the graph alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qlower.errors import VerificationError
from qlower.ir.graph import Graph
from qlower.ir.verifier import verify_graph


@dataclass(frozen=True)
class Rewritten:
    """A rewrite's result: the new graph, and the names of the values of the received graph whose
    codes it may change (each still in ``graph``, with its type; empty for an exact rewrite or
    when nothing was rewritten)."""

    graph: Graph
    values: tuple[str, ...] = ()


class Rewrite(ABC):
    """One named rewrite with its declaration (module docstring)."""

    name: str
    steps: int            # 0: exact; k: within k steps per rewritten op
    what: str             # one line: what it changes and why

    @abstractmethod
    def apply(self, graph: Graph) -> Rewritten:
        """``graph`` rewritten (``graph`` itself when nothing applies)."""

    @property
    def bound(self) -> str:
        return bound_text(self.steps)


def bound_text(steps: int) -> str:
    return "exact" if steps == 0 else f"within {steps} step{'s' if steps != 1 else ''} per rewritten op"


@dataclass(frozen=True)
class AppliedRewrite:
    """What a program records of a rewrite it went through (JSON-able, kept in its file)."""

    name: str
    steps: int
    what: str
    values: tuple[str, ...]

    @property
    def bound(self) -> str:
        return bound_text(self.steps)

    def as_meta(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "what": self.what, "values": list(self.values)}

    @classmethod
    def from_meta(cls, d: Any) -> AppliedRewrite:
        """From ``as_meta``'s form; ValueError for anything else (a program file is input)."""
        if not isinstance(d, dict) or set(d) != {"name", "steps", "what", "values"}:
            raise ValueError("a rewrite record is an object with name, steps, what and values")
        name, steps, what, values = d["name"], d["steps"], d["what"], d["values"]
        if not isinstance(name, str) or not isinstance(what, str) or type(steps) is not int or steps < 0 \
                or not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError("a rewrite record has a name, a count of steps >= 0, a text and value names")
        return cls(name, steps, what, tuple(values))


def apply_rewrite(rewrite: Rewrite, graph: Graph) -> Rewritten:
    """``rewrite.apply(graph)``, its result verified: a VerificationError names the rewrite when
    the result breaks an IR rule or its declaration names a value the two graphs don't share."""
    out = rewrite.apply(graph)
    if out.graph is graph:
        return out
    try:
        verify_graph(out.graph)
    except VerificationError as e:
        raise VerificationError(f"backend rewrite {rewrite.name} made an invalid graph: {e}") from e
    before = {v.name: v.type for v in graph.values()}
    after = {v.name: v.type for v in out.graph.values()}
    lost = [n for n in out.values if n not in before or after.get(n) != before[n]]
    if lost:
        raise VerificationError(f"backend rewrite {rewrite.name} declares values it did not keep with their "
                                f"types: {', '.join('%' + n for n in lost[:5])}")
    return out


def apply_rewrites(graph: Graph, rewrites: Sequence[Rewrite]) -> tuple[Graph, list[AppliedRewrite]]:
    """``graph`` through each rewrite in order (each verified, see ``apply_rewrite``), and a record
    of those that changed it."""
    applied = []
    for rewrite in rewrites:
        out = apply_rewrite(rewrite, graph)
        if out.graph is not graph:
            applied.append(AppliedRewrite(rewrite.name, rewrite.steps, rewrite.what, out.values))
            graph = out.graph
    return graph, applied
