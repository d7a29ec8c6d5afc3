"""Import rules: one small function per op, registered in one table (like torch._inductor's lowerings).

A rule is called as ``rule(ctx, node, **arguments)``: the op's schema arguments
by name (``self`` is named ``input``), defaults filled in, each fx node replaced
by what it imported to (a ``Ref``). It returns the ``Ref`` of the node's result.
Rules are keyed by OpOverloadPacket, so every overload of an op (``.default``,
``.Tensor``, ``.int``, ...) reaches the same rule, which checks the overload
when it matters.
"""

from __future__ import annotations

from collections.abc import Callable

from qlower.registry import Registry

Rule = Callable[..., object]
RULES: Registry[object, Rule] = Registry("import rules")
# Non-core ops whose rule only handles statically quantized tensors (as a lookup table): elsewhere
# (float or dynamic import) they are decomposed into core ops before quantization, like ops without a rule.
STATIC_ONLY: set[object] = set()


def register(*targets: object) -> Callable[[Rule], Rule]:
    return RULES.register(*targets)


def rule_for(target: object) -> Rule | None:
    rule = RULES.get(getattr(target, "overloadpacket", target))
    return rule if rule is not None else RULES.get(target)


def has_rule(target: object, static: bool = True) -> bool:
    """Whether ``target`` reaches a rule (``static``: in a statically quantized import)."""
    load_all()
    if not static and getattr(target, "overloadpacket", target) in STATIC_ONLY:
        return False
    return rule_for(target) is not None


def load_all() -> None:
    """Import every rule module (each registers its rules on import)."""
    from qlower.frontend.rules import (  # noqa: F401
        compare,
        elementwise,
        gemm,
        indexing,
        log_softmax,
        movement,
        normalization,
        pointwise,
        pooling,
        quantization,
        reductions,
        resample,
        softmax,
        transpose_conv,
    )
