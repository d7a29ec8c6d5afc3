"""A float host op for a non-core aten op that an integer rule can't take in some case.

Only core ATen ops can be float fallbacks; ``max_pool2d``, ``conv_transpose2d`` or
``adaptive_avg_pool2d`` are not core, and once they have an import rule they are
not decomposed either. A rule that can't make such a case integer calls
``on_host`` with the core op that computes the same result (e.g.
``aten.convolution`` with ``transposed=True``), so the case still runs, in float,
exactly as PyTorch defines it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.fx import Node

from qlower.frontend.context import ImportContext, Ref
from qlower.frontend.fallback import import_fallback


class _Call:
    """The parts of an fx node that ``import_fallback`` reads, with another target and arguments."""

    op = "call_function"

    def __init__(self, node: Node, target, args: Sequence[object]) -> None:
        self.target, self.args, self.kwargs = target, tuple(args), {}
        self.meta, self.name = node.meta, node.name


def on_host(ctx: ImportContext, node: Node, target, args: Sequence[object], reason: str) -> Ref:
    """``node`` as the float core ATen op ``target(*args)`` (``args`` name fx nodes for tensors)."""
    if ctx.fallback != "float":
        raise ctx.unsupported(reason)
    return import_fallback(ctx, _Call(node, target, args))


def node_arg(node: Node, index: int, name: str) -> object:
    """An argument of ``node`` as written in the graph (an fx node for a tensor), or None."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)
