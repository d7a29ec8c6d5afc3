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


class ConfigError(QlowerError, ValueError):
    """An argument, option or setting has a value qlower does not accept (the message names
    the argument and what is accepted). Also a ValueError, as such errors were before."""


class UnknownTargetError(ConfigError):
    """A target name that no backend compiles for (the message lists the known ones)."""


class SaveError(QlowerError, OSError):
    """A program or model file could not be written; the file that was there is left intact."""
