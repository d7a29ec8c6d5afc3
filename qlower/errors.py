"""qlower's error hierarchy. Every error a user can see is one of these.

A message names the model location (module path and source line) when there
is one, says what is wrong and, where it can, what to do about it.
"""

from __future__ import annotations


class QlowerError(Exception):
    """Base of every error qlower raises on purpose."""


class IRError(QlowerError):
    """An op was built with operands or attributes its definition rejects."""


class VerificationError(QlowerError):
    """A graph breaks an IR rule, or two stages of a compile disagree."""


class UnsupportedOpError(QlowerError):
    """The model uses an op (or a form of it) that qlower can't lower."""


class CompileError(QlowerError):
    """A backend failed to lower or validate a partition."""


class InvalidProgramError(QlowerError):
    """A program file is corrupt, foreign, or from a newer qlower."""


class InputError(QlowerError):
    """Inputs given to ``run`` don't match what the program expects."""


class ExecutionError(QlowerError):
    """A backend executor failed while running a compiled partition."""
