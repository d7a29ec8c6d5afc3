"""A sweep's jobs and the specs that make them: a grid (models × targets × configurations) or a list.

A job is one model compiled for one target under one quantization and backend configuration, and
what to measure of it. A spec is a TOML file (read with ``tomllib``)::

    measures = ["verify", "cycles"]          # default for every job below
    size = 32                                # image models' input size (optional)

    [grid]                                   # every combination of these axes
    models = ["zoo:tiny_cnn", "models.py:build"]
    targets = ["cpu", "ethos-u55-128"]
    quant = { per_channel = [true, false] }  # QuantConfig fields: a list is an axis, a value is fixed
    options = { memory_mode = ["Shared_Sram"] }   # backend options: for the targets that take them

    [[job]]                                  # and/or single jobs
    model = "zoo:ds_cnn_kws"
    target = "ethos-u85-256"
    quant = { observer = "mse" }
    options = { memory_mode = "Dedicated_Sram_384KB" }
    resources = { num_cpus = 2 }             # hints for Ray
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from qlower.errors import ConfigError

MEASURES = ("compile", "verify", "accuracy", "cycles", "latency")
DEFAULT_MEASURES = ("verify",)


@dataclass(frozen=True)
class Job:
    """``model``: ``"zoo:NAME"``, ``"FILE.py:FACTORY"`` (the factory returns ``(model, example_inputs)``
    or ``(model, example_inputs, quant, calibration)``) or such a factory itself, a module-level
    function (its process imports it by name). ``quant``: ``QuantConfig`` fields over the model's own
    config (a zoo model's, or the default). ``options``: the target's backend options. ``measures``:
    some of ``MEASURES`` (compile always happens). ``resources``: Ray task hints (``num_cpus``, ...).
    ``trained``: a zoo model's trained weights (top-1 accuracy on its held-out digits)."""

    model: str | Callable[[], tuple]
    target: str
    quant: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    measures: tuple[str, ...] = DEFAULT_MEASURES
    size: int | None = None
    trained: bool = False
    resources: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_model_spec(self.model)
        if not isinstance(self.target, str) or not self.target:
            raise ConfigError(f"a job's target is a target name such as 'cpu', got {self.target!r}")
        object.__setattr__(self, "measures", check_measures(self.measures))
        for name in ("quant", "options", "resources"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise ConfigError(f"a job's {name} is a table of KEY = VALUE, got {type(value).__name__}")
            object.__setattr__(self, name, dict(sorted(value.items())))
        from qlower.frontend.config import QuantConfig

        known = {f.name for f in fields(QuantConfig)}
        unknown = sorted(set(self.quant) - known)
        if unknown:
            raise ConfigError(f"unknown QuantConfig field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if self.size is not None and (not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1):
            raise ConfigError(f"size is an input height/width, an integer >= 1; got {self.size!r}")

    @property
    def model_name(self) -> str:
        """How rows name the model: the spec string, or ``module:function`` for a factory."""
        return model_label(self.model)

    def describe(self) -> dict[str, Any]:
        """The job as plain data (a row's first columns; part of its cache key)."""
        return {"model": self.model_name, "size": self.size, "trained": self.trained, "target": self.target,
                "quant": dict(self.quant), "options": dict(self.options), "measures": list(self.measures)}


def model_label(model: str | Callable) -> str:
    if isinstance(model, str):
        return model
    return f"{getattr(model, '__module__', '?')}:{getattr(model, '__qualname__', repr(model))}"


def check_model_spec(model: Any) -> None:
    if callable(model):
        if "<locals>" in getattr(model, "__qualname__", "") or getattr(model, "__name__", "") == "<lambda>":
            raise ConfigError(f"a job's model factory runs in another process, which imports it by name: "
                              f"{model_label(model)} is a lambda or a local function; define it at module level")
        return
    if not isinstance(model, str) or not (model.startswith("zoo:") or ":" in model.rstrip(":")):
        raise ConfigError(f"a job's model is zoo:NAME, FILE.py:FACTORY or a factory function; got {model!r}")
    if model.startswith("zoo:"):
        from qlower import zoo

        if model[4:] not in zoo.names():
            raise ConfigError(f"unknown zoo model {model[4:]!r}; `qlower zoo` lists them")
    else:
        path = model.rpartition(":")[0]
        if not Path(path).is_file():
            raise ConfigError(f"model {model!r}: no file {path!r} (expected zoo:NAME or FILE.py:FACTORY)")


def check_measures(measures: Any) -> tuple[str, ...]:
    if isinstance(measures, str):
        measures = [m for m in measures.split(",") if m]
    if not isinstance(measures, Sequence) or not all(isinstance(m, str) for m in measures):
        raise ConfigError(f"measures is a list of {', '.join(MEASURES)}; got {measures!r}")
    unknown = [m for m in measures if m not in MEASURES]
    if unknown:
        raise ConfigError(f"unknown measure(s) {', '.join(map(repr, unknown))}; known: {', '.join(MEASURES)}")
    return tuple(m for m in MEASURES if m in measures) or ("compile",)


def _axes(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of a table whose list values are axes (a value that is not a list is fixed)."""
    keys = sorted(table)
    values = [v if isinstance(v, list) else [v] for v in (table[k] for k in keys)]
    for k, v in zip(keys, values):
        if not v:
            raise ConfigError(f"axis {k!r} is an empty list")
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def _options_for(target: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``options`` that ``target``'s backend takes (a grid's options go to those targets)."""
    from qlower.backends.registry import HOST_TARGETS, _backend_class, option_types

    if target in HOST_TARGETS:
        return {}
    taken = option_types(_backend_class(target, None))
    return {k: v for k, v in options.items() if k in taken}


def grid(models: Iterable[str | Callable], targets: Iterable[str], *, quant: Mapping[str, Any] | None = None,
         options: Mapping[str, Any] | None = None, measures: Sequence[str] = DEFAULT_MEASURES,
         size: int | None = None, trained: bool = False, resources: Mapping[str, Any] | None = None) -> list[Job]:
    """Every model × target × combination of ``quant`` and ``options`` axes (a list value is an axis).
    An option goes to the targets whose backend takes it; one that no target takes is an error."""
    models, targets = list(models), list(targets)
    if not models or not targets:
        raise ConfigError("a grid needs at least one model and one target")
    from qlower.backends.registry import check_target

    for target in targets:
        check_target(target, None)
    options = dict(options or {})
    for key in options:
        if not any(key in _options_for(t, {key: None}) for t in targets):
            raise ConfigError(f"backend option {key!r} is taken by none of the targets {', '.join(targets)}")
    jobs: list[Job] = []
    seen = set()
    for model, target, q, o in itertools.product(models, targets, _axes(quant or {}), _axes(options)):
        job = Job(model, target, q, _options_for(target, o), tuple(measures), size, trained, dict(resources or {}))
        key = (model_label(model), repr(job.describe()))
        if key not in seen:   # a target that takes none of the options appears once, not once per value
            seen.add(key)
            jobs.append(job)
    return jobs


def load_spec(path: str | Path) -> list[Job]:
    """The jobs of a TOML spec (see the module's docstring): its grid's, then its ``[[job]]`` list's. A
    relative FILE.py model path is relative to the spec's folder."""
    path = Path(path)
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"sweep spec {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"sweep spec {path} is not valid TOML: {e}") from None
    known = {"grid", "job", "measures", "size", "trained"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ConfigError(f"sweep spec {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    defaults = {"measures": spec.get("measures", list(DEFAULT_MEASURES)), "size": spec.get("size"),
                "trained": spec.get("trained", False)}

    def model_path(model: Any) -> Any:
        if isinstance(model, str) and not model.startswith("zoo:") and ":" in model:
            file, _, factory = model.rpartition(":")
            if not Path(file).is_absolute():
                return f"{path.parent / file}:{factory}"
        return model

    jobs: list[Job] = []
    if "grid" in spec:
        g = dict(spec["grid"])
        extra = sorted(set(g) - {"models", "targets", "quant", "options", "measures", "size", "trained", "resources"})
        if extra:
            raise ConfigError(f"sweep spec {path}: unknown [grid] key(s) {', '.join(extra)}")
        jobs += grid([model_path(m) for m in _list(g.get("models"), "grid.models")], _list(g.get("targets"), "grid.targets"),
                     quant=g.get("quant"), options=g.get("options"),
                     measures=g.get("measures", defaults["measures"]), size=g.get("size", defaults["size"]),
                     trained=g.get("trained", defaults["trained"]), resources=g.get("resources"))
    for i, entry in enumerate(spec.get("job", [])):
        if not isinstance(entry, dict) or "model" not in entry or "target" not in entry:
            raise ConfigError(f"sweep spec {path}: [[job]] #{i + 1} needs a model and a target")
        extra = sorted(set(entry) - {f.name for f in fields(Job)})
        if extra:
            raise ConfigError(f"sweep spec {path}: [[job]] #{i + 1} has unknown key(s) {', '.join(extra)}")
        jobs.append(Job(**{**defaults, **entry, "model": model_path(entry["model"]),
                           "measures": tuple(check_measures(entry.get("measures", defaults["measures"])))}))
    if not jobs:
        raise ConfigError(f"sweep spec {path} has neither a [grid] nor a [[job]]")
    return jobs


def _list(value: Any, name: str) -> list:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{name} is a non-empty list")
    return value


def _typed(text: str) -> Any:
    """A command-line value as TOML would read it: true/false, an integer, a float, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(texts: Sequence[str], flag: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text in texts:
        key, sep, values = text.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"{flag} takes KEY=VALUE or KEY=V1,V2 (an axis), got {text!r}")
        out[key] = values.split(",")
    return out


def grid_from_text(models: Sequence[str], targets: Sequence[str], *, quant: Sequence[str] = (),
                   options: Sequence[str] = (), measures: str | Sequence[str] = DEFAULT_MEASURES,
                   size: int | None = None, trained: bool = False) -> list[Job]:
    """``grid`` from the command line's text: ``quant`` / ``options`` as ``KEY=VALUE`` or ``KEY=V1,V2``
    (an axis), backend options typed as each target's backend declares them."""
    from qlower.backends.registry import check_target, parse_backend_options

    for target in targets:
        check_target(target, None)
    quant_axes = {k: [_typed(v) for v in vs] for k, vs in _pairs(quant, "--quant").items()}
    option_texts = _pairs(options, "--option")
    for key in option_texts:
        if not any(key in _options_for(t, {key: None}) for t in targets):
            raise ConfigError(f"backend option {key!r} is taken by none of the targets {', '.join(targets)}")
    jobs: list[Job] = []
    for target in targets:
        axes = {k: [parse_backend_options(target, {k: v})[k] for v in vs]
                for k, vs in option_texts.items() if k in _options_for(target, {k: None})}
        jobs += grid(models, [target], quant=quant_axes, options=axes, measures=check_measures(measures),
                     size=size, trained=trained)
    order = {model_label(m): i for i, m in enumerate(models)}
    return sorted(jobs, key=lambda j: order[j.model_name])   # model by model, targets in the order given
