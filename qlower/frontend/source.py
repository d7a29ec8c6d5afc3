"""Where an fx node comes from in the user's model: source file:line and module path.

``torch.export`` records ``stack_trace`` (a traceback, outermost frame first) and
``nn_module_stack`` (module path → class, outermost first) on the nodes it traces;
``convert_pt2e`` ports the stack trace to the q/dq nodes it inserts. Library
frames (torch, torchao) come last for calls into ``nn.Module`` leaves, so the
user's line is the last frame outside those packages.
"""

from __future__ import annotations

import os
import re

from torch.fx import Node

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_LIBRARY = re.compile(r"[/\\](torch|torchao)[/\\]")


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # other drive (Windows)
        return path
    return path if rel.startswith("..") else rel


def source_location(node: Node) -> str:
    """``file:line`` of the innermost user frame that created ``node`` ('' when unknown)."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    user = [f for f in frames if not _LIBRARY.search(f[0])]
    if not user:
        return ""
    path, line, _ = user[-1]
    return f"{_short_path(path)}:{line}"


def module_paths(node: Node) -> list[str]:
    """Qualified names of the modules ``node`` was traced in, outermost first ('' is the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    return [path for path, _ in stack.values()]


def module_path(node: Node) -> str:
    """Qualified name of the innermost module that created ``node`` ('' for the root or unknown)."""
    paths = module_paths(node)
    return paths[-1] if paths else ""


def module_class(node: Node) -> str:
    """Class name of the innermost module that created ``node`` ('' when unknown)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    _, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return name.rsplit(".", 1)[-1]


def describe_node(node: Node) -> str:
    """``'<source> in module <path> (<Class>)'`` for error messages."""
    parts = []
    src = source_location(node)
    parts.append(f"at {src}" if src else "at an unknown source line")
    path = module_path(node)
    if path:
        parts.append(f"in module '{path}' ({module_class(node)})")
    elif module_class(node):
        parts.append(f"in the top-level module ({module_class(node)})")
    return " ".join(parts)
