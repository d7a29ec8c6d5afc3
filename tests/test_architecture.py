"""The layers of the package hold: no module imports a later stage of the pipeline (at module
level or inside a function), and the IR and the reference interpreter load without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import qlower

PACKAGE = Path(qlower.__file__).parent

# the pipeline, first stage first: a module may import its own layer and earlier ones only
LAYERS: list[set[str]] = [
    {"errors", "_quiet", "progress", "registry"},  # leaves
    {"ir"},                                    # the typed graph and requantization
    {"contract", "reference"},                 # the backend contract; the meaning of every op
    {"frontend", "passes"},                    # PyTorch → IR; IR → IR
    {"partition"},                             # which backend takes which op
    {"backends"},                              # code generators and their executors
    {"runtime"},                               # running host graph + partitions
    {"program"},                               # what a program holds, its file
    {"verification"},                          # every stage compared per layer
    {"api", "zoo", "testing", "cli", "__init__"},   # what users call
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, nested ones included."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert units - set(LAYER_OF) == set(), "add new top-level modules to LAYERS"


def test_no_module_imports_a_later_stage():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _unit(_module_name(path))
        for line, name in _imports(path):
            if not name.startswith("qlower.") and name != "qlower":
                continue
            there = _unit(name) if name != "qlower" else "__init__"
            if LAYER_OF.get(there, -1) > LAYER_OF[here]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports {name} ({there})")
    assert wrong == [], "imports against the pipeline:\n" + "\n".join(wrong)


def test_the_scan_sees_nested_and_relative_imports(tmp_path):
    """The check itself can fail: a function-level import of a later stage is found, and a
    relative import resolves to its absolute name."""
    probe = tmp_path / "qlower" / "ir" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from qlower.api import compile\n    from ..program import fileformat\n")
    found = _imports(probe, tmp_path)
    assert (2, "qlower.api.compile") in found and (3, "qlower.program.fileformat") in found


def test_ir_and_reference_import_without_torch():
    code = ("import sys, qlower.ir, qlower.reference, qlower.ir.requant; "
            "heavy = sorted(m for m in ('torch', 'torchao', 'tosa_serializer', 'qlower.api', 'qlower.frontend', "
            "'qlower.program', 'qlower.verification') if m in sys.modules); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_public_names_load_on_first_use():
    code = ("import sys, qlower; assert 'torch' not in sys.modules; "
            "print(callable(qlower.compile), callable(qlower.verify), qlower.zoo.names()[0], "
            "qlower.QuantConfig.__name__, qlower.Program.__name__, callable(qlower.load), 'cpu' in qlower.targets())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["True", "True", "tiny_cnn", "QuantConfig", "Program", "True", "True"]


def test_shipped_code_needs_no_test_only_package():
    """hypothesis and pytest are test extras: no module of the package imports them at load time
    (a function may, for helpers only tests call)."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:   # module level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0] in ("hypothesis", "pytest")]
    assert wrong == []
