"""Name -> thing tables filled as modules load (op definitions, kernels, lowerings, rules, targets).

Two modules registering the same name would otherwise leave whichever loaded last, silently
and depending on import order. Registering is therefore checked: a second registration of a
key is a ``DuplicateRegistrationError`` naming the table and the key. Plain item assignment
stays a dict's (tests swap an entry on purpose, e.g. with ``monkeypatch.setitem``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from qlower.errors import QlowerError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
F = TypeVar("F")


class DuplicateRegistrationError(QlowerError):
    """A table got a second entry for a key it already holds."""


def _describe(thing: object) -> str:
    module, name = getattr(thing, "__module__", None), getattr(thing, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(thing)


class Registry(dict[K, V]):
    """A dict whose entries are added once each, through ``add`` or the ``register`` decorator."""

    def __init__(self, name: str, entries: Iterable[tuple[K, V]] = ()) -> None:
        super().__init__()
        self.name = name
        for key, value in entries:
            self.add(key, value)

    def add(self, key: K, value: V) -> V:
        if key in self:
            raise DuplicateRegistrationError(
                f"{self.name}: {key!r} is registered twice ({_describe(self[key])}, then {_describe(value)})")
        super().__setitem__(key, value)
        return value

    def register(self, *keys: K) -> Callable[[F], F]:
        """A decorator adding the function under each of ``keys``."""
        def wrap(fn: F) -> F:
            for key in keys:
                self.add(key, fn)
            return fn
        return wrap
