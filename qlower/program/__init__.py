"""Compiled programs: what a program holds (program.py) and its file format (fileformat.py)."""

from qlower.program.program import Program

__all__ = ["Program"]
