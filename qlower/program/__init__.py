"""Compiled programs (and, later, their file format)."""

from qlower.program.program import Program, as_numpy

__all__ = ["Program", "as_numpy"]
