"""Every name -> thing table filled at import time rejects a second registration of a name."""

from __future__ import annotations

import re

import pytest

from qlower.registry import DuplicateRegistrationError, Registry


def test_a_second_registration_names_the_table_and_the_key():
    table: Registry[str, object] = Registry("test table")

    @table.register("a", "b")
    def first():
        return 1

    assert table["a"] is first and table["b"] is first
    with pytest.raises(DuplicateRegistrationError, match=r"test table: 'b' is registered twice .*first.*second"):
        @table.register("b")
        def second():
            return 2
    assert table["b"] is first
    with pytest.raises(DuplicateRegistrationError, match="test table: 'a'"):
        table.add("a", 3)
    with pytest.raises(DuplicateRegistrationError, match="built: 'x'"):
        Registry("built", [("x", 1), ("x", 2)])


def test_item_assignment_still_replaces():
    """Tests swap an entry on purpose (monkeypatch.setitem): that stays a dict's assignment."""
    table: Registry[str, int] = Registry("t", [("k", 1)])
    table["k"] = 2
    assert table == {"k": 2}


def _tables():
    from qlower.backends.cpu.context import BUILDERS, builder
    from qlower.backends.tosa.lowering import LOWERINGS, lowering
    from qlower.backends.tosa.support import CHECKS, _check
    from qlower.frontend.rules import RULES, load_all, register
    from qlower.ir.opdefs import OPS
    from qlower.ir.opdefs import register as op
    from qlower.ir.verifier import RULES as VERIFIER_RULES
    from qlower.ir.verifier import rule
    from qlower.reference.registry import KERNELS, kernel

    load_all()
    return [(OPS, lambda k: op(k, ("input",))), (VERIFIER_RULES, rule), (KERNELS, kernel), (RULES, register),
            (BUILDERS, builder), (CHECKS, _check), (LOWERINGS, lowering)]


@pytest.mark.parametrize("index", range(7))
def test_every_table_rejects_a_duplicate(index):
    table, decorator = _tables()[index]
    assert isinstance(table, Registry) and len(table) > 0
    key = next(iter(table))
    before = table[key]
    with pytest.raises(DuplicateRegistrationError, match=re.escape(f"{table.name}: {key!r} is registered twice")):
        decorator(key)(lambda *a: None)
    assert table[key] is before
