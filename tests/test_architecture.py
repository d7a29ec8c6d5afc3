"""The layers of the package hold: no module imports a later stage of the pipeline (at module
level or inside a function), in the order DESIGN.md draws it; the IR imports only the leaves;
backends never import the frontend; the CLI calls only the public API; and the IR and the
reference interpreter load without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import qlower

PACKAGE = Path(qlower.__file__).parent

# DESIGN.md's pipeline as drawn, first stage first (the IR is the data every stage passes on)
DESIGN_ORDER = ("frontend", "ir", "passes", "partition", "backends", "program", "runtime", "verification")
LEAVES = {"errors", "_quiet", "progress", "registry", "late", "safe_paths", "native_build"}   # import nothing of qlower but each other

# a module may import its own layer and earlier ones only
LAYERS: list[set[str]] = [
    LEAVES,
    {"ir"},                                    # the typed graph and requantization
    {"contract", "reference"},                 # the backend contract; the meaning of every op
    {"frontend"},                              # PyTorch → IR
    {"passes"},                                # IR → IR
    {"partition"},                             # which backend takes which op
    {"backends"},                              # code generators and their executors
    {"program"},                               # what a program holds, its file
    {"runtime"},                               # running host graph + partitions
    {"verification"},                          # every stage compared per layer
    {"api", "zoo", "testing", "cli", "__init__", "sweep", "view", "model_spec"},   # what users call
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


def test_layers_follow_design_order():
    """The stages keep DESIGN.md's order; the IR, which every stage uses, comes before all but the leaves."""
    staged = [u for u in DESIGN_ORDER if u != "ir"]
    assert [LAYER_OF[u] for u in staged] == sorted(LAYER_OF[u] for u in staged)
    assert len({LAYER_OF[u] for u in staged}) == len(staged), "one stage per layer"
    assert LAYER_OF["ir"] == 1 and all(LAYER_OF[u] == 0 for u in LEAVES)


def _qlower_imports(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    return [(line, name) for line, name in _imports(path, root) if name == "qlower" or name.startswith("qlower.")]


def test_the_ir_imports_only_the_leaves():
    wrong = [f"{p.relative_to(PACKAGE.parent)}:{line} imports {name}" for p in sorted((PACKAGE / "ir").rglob("*.py"))
             for line, name in _qlower_imports(p) if _unit(name) not in LEAVES | {"ir"}]
    assert wrong == []


def test_backends_never_import_the_frontend():
    wrong = [f"{p.relative_to(PACKAGE.parent)}:{line} imports {name}"
             for p in sorted((PACKAGE / "backends").rglob("*.py"))
             for line, name in _qlower_imports(p) if _unit(name) == "frontend"]
    assert wrong == []


PUBLIC_MODULES = {"zoo", "errors", "sweep", "view", "safe_paths", "model_spec"}   # qlower.zoo / .errors / .sweep / .view: what their __all__ lists (or every public name)


def _public(name: str) -> bool:
    """``qlower``, a name of ``qlower.__all__``, or a public module and what its ``__all__`` lists."""
    import importlib

    parts = name.split(".")[1:]
    if not parts:
        return True
    if parts[0] in qlower.__all__:
        return len(parts) == 1
    if parts[0] not in PUBLIC_MODULES:
        return False
    module = importlib.import_module(f"qlower.{parts[0]}")
    listed = getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")])
    return len(parts) == 1 or (len(parts) == 2 and parts[1] in listed)


def _cli_uses(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """Every qlower name the file imports or reads as ``qlower.X`` / ``zoo.X``."""
    uses = _qlower_imports(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr != "__doc__":
            if node.value.id == "qlower":
                uses.append((node.lineno, f"qlower.{node.attr}"))
            elif node.value.id in PUBLIC_MODULES:
                uses.append((node.lineno, f"qlower.{node.value.id}.{node.attr}"))
    return uses


def test_the_cli_uses_only_public_names():
    wrong = [f"cli.py:{line} uses {name}" for line, name in _cli_uses(PACKAGE / "cli.py") if not _public(name)]
    assert wrong == [], "make what the CLI needs public (qlower/__init__.py), then use that:\n" + "\n".join(wrong)


def test_the_cli_check_sees_internal_names(tmp_path):
    probe = tmp_path / "qlower" / "cli.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import qlower\nfrom qlower import zoo\n\ndef f():\n    from qlower.program.fileformat import "
                     "write_atomically\n    zoo.trained.RECIPES\n    qlower.compile\n    qlower.api.lower_graph\n")
    uses = sorted(set(_cli_uses(probe, tmp_path)))
    assert [name for _, name in uses if not _public(name)] == [
        "qlower.program.fileformat", "qlower.program.fileformat.write_atomically", "qlower.zoo.trained",
        "qlower.api"]


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


def test_a_program_runs_without_importing_the_runtime_itself():
    """program/ never imports runtime/ (a later stage): the package root binds it (qlower/late.py), on first run."""
    code = ("import sys, numpy as np; from qlower.program import Program; "
            "from qlower.testing.programs import movement_graph; g = movement_graph(); "
            "before = 'qlower.runtime' in sys.modules; "
            "out = Program('reference', g, g).run(*[np.zeros(v.shape, v.dtype.numpy) for v in g.inputs]); "
            "print(before, 'qlower.runtime' in sys.modules, len(out))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True", "3"], out.stdout + out.stderr


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
