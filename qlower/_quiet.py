"""Silence two import-time warnings that say nothing to a qlower user (imported first by qlower).

torchao warns on every import that its CUDA-only extensions don't load in a CPU
build of torch, and torch warns that torchao registers an Enum the old way.
"""

from __future__ import annotations

import logging

_NOISE = {
    "torchao": ("Failed to load",),
    "torch.utils._pytree": ("<enum 'KernelPreference'> is an Enum subclass",),
}


class _DropKnownNoise(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


for _name, _prefixes in _NOISE.items():
    logging.getLogger(_name).addFilter(_DropKnownNoise(_prefixes))
