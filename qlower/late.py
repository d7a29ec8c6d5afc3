"""Operations an earlier stage offers and a later stage implements, bound by the package root.

No stage imports a later one (DESIGN.md), yet a ``Program`` (the program stage) runs, and
running is the runtime's, the stage after it. The program calls through a slot here;
``qlower/__init__.py``, which every ``qlower.*`` import loads first and which may see every
stage, fills the slot with a function that imports the runtime on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qlower.registry import Registry

# "runner_for": (target, graph, partitions, threads) -> the program's executor (qlower.runtime.runner_for);
# "as_numpy": (value, what) -> the input as a NumPy array (qlower.runtime.as_numpy)
LATE: Registry[str, Callable[..., Any]] = Registry("late-bound stage operations")


def late(name: str) -> Callable[..., Any]:
    """The function bound to ``name``."""
    try:
        return LATE[name]
    except KeyError:
        raise RuntimeError(f"no stage provides {name!r}: qlower/__init__.py binds it") from None
