"""The public entry points: ``compile``, ``verify``, ``evaluate``, ``sensitivity`` and ``prepare_qat``, and what the command
line needs beyond them (``tflite_exact_kernels``, ``save_arrays``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from qlower.backends.registry import backend_for, backend_threads, check_target
from qlower.backends.threads import check_threads
from qlower.errors import ConfigError
from qlower.frontend.config import QuantConfig
from qlower.ir import Graph
from qlower.ir.rewrite import apply_rewrites
from qlower.program import Program

DEFAULT_QUANT = QuantConfig()
# torch.export, prepare_pt2e and convert_pt2e keep their dispatch-mode stack in process-wide state:
# two threads tracing at once corrupt each other's capture. Tracing is serialized here (re-entrant:
# auto_int16 measures sensitivity inside compile); import, passes and lowering run in parallel.
TRACING = threading.RLock()


def lower_graph(graph: Graph, target: str, threads: int | None = None, meta: dict | None = None,
                trace: bool = False, backend_options: dict[str, Any] | None = None,
                progress: bool = False) -> Program:
    """Rewrite an optimised IR graph for ``target`` (the backend's declared rewrites, the IR
    verified after each), partition it and lower its partitions (``backend_options``: arguments
    of the target's backend, see ``compile``; ``progress``: a progress bar). The program's
    ``canonical`` is ``graph``, its ``source`` the rewritten form."""
    check_target(target, backend_options)
    threads, backend_options = backend_threads(target, check_threads(threads), backend_options)
    meta = dict(meta or {})
    meta["threads"] = threads
    backend = backend_for(target, backend_options)
    from qlower.partition import float_fallbacks, partition

    if backend is None:
        return Program(target, graph, graph, decisions=float_fallbacks(graph), meta=meta, canonical=graph)

    t0 = time.perf_counter()
    # the backend's rewrites, each verified; the program keeps the graph they received (canonical)
    form, applied = apply_rewrites(graph, backend.rewrites(target))
    if applied:
        meta["rewrites"] = [r.as_meta() for r in applied]
    result = partition(form, backend, target, trace=trace, progress=progress)
    meta["lower_seconds"] = round(time.perf_counter() - t0, 4)
    return Program(target, result.host, form, result.partitions, result.decisions, meta, canonical=graph)


def compile(model: Any, example_inputs: Sequence[Any], target: str = "reference",
            quant: QuantConfig | None = DEFAULT_QUANT, calibration: Sequence[Sequence[Any]] | None = None,
            *, progress: bool = True, verify_passes: bool = False, threads: int | None = None,
            trace: bool = False, backend_options: dict[str, Any] | None = None) -> Program:
    """Quantize ``model`` (``quant=None`` keeps it in float), import it, optimise and lower it for ``target``.

    A model quantized already is compiled with its own quantization, without calibration: torchao's
    ``convert_pt2e`` output (any quantizer) or a QAT model (``prepare_qat``, or torchao's
    ``prepare_qat_pt2e``); ``quant`` may then only set ``fallback``, and what the target can't hold
    exactly is refused by node and source line (frontend/pt2e_input.py).

    ``calibration`` is a list of input tuples (default: the example inputs);
    a progress bar runs over it unless ``progress=False``. ``trace`` keeps what
    per-layer verification needs to look inside partitions. ``backend_options``
    go to the target's backend, e.g. ``{"system_config": "Ethos_U85_SYS_DRAM_High",
    "memory_mode": "Dedicated_Sram_384KB"}`` for Ethos-U targets. ``threads`` is the program's
    thread count; a backend's own ``threads`` option (litert) is the same setting.
    """
    from qlower.frontend import capture_and_import
    from qlower.frontend.arguments import check_calibration, check_example_inputs, check_model, check_quant
    from qlower.frontend.pt2e_input import import_prequantized, quantized_form
    from qlower.passes import default_pipeline

    # every argument is checked before the minutes of export and calibration, not after
    check_target(target, backend_options)
    backend_threads(target, check_threads(threads), backend_options)
    model, quant = check_model(model), check_quant(quant)
    example_inputs = check_example_inputs(example_inputs)
    calibration = check_calibration(calibration if calibration is not None else [example_inputs], example_inputs)
    t0 = time.perf_counter()
    promoted = []
    with TRACING:
        if quantized_form(model) is not None:  # quantized already (PT2E, QAT): its q/dq nodes taken as given
            front = import_prequantized(model, example_inputs, quant, target)
            quant = getattr(model, "qlower_quant", None) or quant
        else:
            if quant is not None and quant.auto_int16:
                quant, promoted = promote_sensitive_layers(model, example_inputs, quant, calibration, progress)
            front = capture_and_import(model, example_inputs, quant, calibration, progress=progress)
    t1 = time.perf_counter()
    graph = default_pipeline(verify=verify_passes).run(front.graph)
    t2 = time.perf_counter()
    prog = lower_graph(graph, target, threads, trace=trace, backend_options=backend_options, progress=progress,
                       meta={"quant": None if quant is None else quant.mode,
                             "frontend_seconds": round(t1 - t0, 4), "passes_seconds": round(t2 - t1, 4),
                             **({"auto_int16": promoted} if promoted else {}),
                             **({"float_reasons": list(front.float_reasons)} if front.float_reasons else {})})
    prog.frontend = front
    return prog


def promote_sensitive_layers(model: Any, example_inputs: tuple, quant: QuantConfig, calibration: list,
                             progress: bool) -> tuple[QuantConfig, list[str]]:
    """``quant`` with its ``auto_int16`` most int8-sensitive layers (measured on the calibration batches)
    added to ``layer_dtypes`` as int16; layers the user set already keep the user's choice."""
    from dataclasses import replace

    plain = replace(quant, auto_int16=0)
    report = sensitivity(model, example_inputs, plain, calibration, progress=progress)
    ranked = [name for name in report.most_sensitive(len(report.layers)) if name != "input"]
    promoted = [name for name in dict.fromkeys(ranked) if name not in quant.layer_dtypes][:quant.auto_int16]
    return replace(plain, layer_dtypes={**{name: "int16" for name in promoted}, **quant.layer_dtypes}), promoted


def verify(model: Any, example_inputs: Sequence[Any], target: str = "reference",
           quant: QuantConfig | None = DEFAULT_QUANT, calibration: Sequence[Sequence[Any]] | None = None,
           inputs: Sequence[Sequence[Any]] | None = None, *, progress: bool = True,
           backend_options: dict[str, Any] | None = None):
    """Compile for ``target`` and compare every stage per layer on ``inputs`` (default: the example inputs).

    Returns a ``VerificationReport``; ``report.ok`` is False when the target is not
    bit-exact with the reference or the reference is more than 1 step from fake-quant.
    """
    from qlower.verification import verify_program

    prog = compile(model, example_inputs, target, quant, calibration, progress=progress, trace=True,
                   backend_options=backend_options)
    return verify_program(prog, list(inputs) if inputs is not None else [tuple(example_inputs)])


def evaluate(model: Any, example_inputs: Sequence[Any], data: Any, target: str = "reference",
             quant: QuantConfig | None = DEFAULT_QUANT, calibration: Sequence[Sequence[Any]] | None = None,
             *, limit: int | None = None, progress: bool = True, backend_options: dict[str, Any] | None = None):
    """Compile for ``target`` and measure top-1 accuracy on labelled ``data`` = ``(inputs, labels)``
    (e.g. ``zoo.held_out(name)``; inputs ``[N, ...]``, one per label): the float model's, the fake-quant
    model's and the program's, and how often the program picks what fake-quant picks. Returns an
    ``AccuracyReport`` (``print`` it); ``limit`` measures the first ``limit`` inputs only."""
    from qlower.verification.accuracy import labelled, measure_accuracy

    labelled(data)  # a malformed data set fails now, not after the compile
    prog = compile(model, example_inputs, target, quant, calibration, progress=progress,
                   backend_options=backend_options)
    return measure_accuracy(prog, data, limit=limit, progress=progress)


def sensitivity(model: Any, example_inputs: Sequence[Any], quant: QuantConfig | None = DEFAULT_QUANT,
                calibration: Sequence[Sequence[Any]] | None = None, data: Any = None, *,
                limit: int | None = None, progress: bool = True):
    """Per layer, the model's output SQNR (and top-1 accuracy when ``data = (inputs, labels)`` is given)
    with only that layer quantized to int8, ranked most sensitive first: a ``SensitivityReport``
    (``print`` it, ``.plot(path)``, ``.most_sensitive(k)``). Quantization is ``compile``'s, calibrated on
    ``calibration``; measured on ``data``'s inputs (the first ``limit``) or else on the calibration batches."""
    from qlower.frontend.arguments import check_calibration, check_example_inputs, check_model, check_quant
    from qlower.verification.accuracy import labelled
    from qlower.verification.sensitivity import capture_switchable, measure_sensitivity

    model, quant = check_model(model), check_quant(quant)
    if quant is None or quant.mode != "static":
        raise ConfigError("sensitivity measures static int8 quantization: pass a QuantConfig(mode='static')")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit is how many inputs to measure on, an integer >= 1; got {limit!r}")
    example_inputs = check_example_inputs(example_inputs)
    calibration = check_calibration(calibration if calibration is not None else [example_inputs], example_inputs)
    if data is not None:
        inputs, labels = labelled(data)
        count = len(labels) if limit is None else min(limit, len(labels))
        batches, labels = [tuple(x[i:i + 1] for x in inputs) for i in range(count)], labels[:count]
    else:
        batches, labels = [tuple(b) for b in calibration][:limit], None
    with TRACING:
        gm, batch = capture_switchable(model, example_inputs, quant, calibration, progress)
    return measure_sensitivity(gm, batches, labels, batch=batch, progress=progress, model=type(model).__name__)


def prepare_qat(model: Any, example_inputs: Sequence[Any], quant: QuantConfig | None = DEFAULT_QUANT,
                calibration: Sequence[Sequence[Any]] | None = None, learn_scales: str | bool = "weights"):
    """Quantization-aware training: a trainable copy of ``model`` with qlower's quantization (``quant``,
    static: the same per-channel / per-tensor weights, activation range and dtype as ``compile``) as
    fake-quants, batch norms folded as training needs them, ranges initialised on ``calibration``
    (default: the example inputs). Train it (``.train()`` / ``.eval()`` work; ``qlower.frontend.qat.
    freeze_ranges`` stops the ranges moving), then ``compile(qat_model, example_inputs, target)``
    compiles it with the learned scales, without calibration. ``learn_scales``: which scales are
    parameters trained with the model (LSQ): ``"weights"``, ``"all"`` or ``"none"`` (min/max). See
    frontend/qat.py."""
    from qlower.frontend.qat import prepare_qat as prepare

    with TRACING:
        return prepare(model, example_inputs, quant, calibration, learn_scales)


def tflite_exact_kernels(program: Program) -> tuple[str, ...]:
    """The LiteRT kernel families under which ``program.export(path, format="tflite")`` computes the
    reference interpreter's numbers exactly (empty: its requantization rounds as none of them do;
    compile for target ``litert`` with the ``kernels`` option you deploy)."""
    from qlower.backends.litert.rounding import exact_kernels

    return tuple(exact_kernels(program.source))


def save_arrays(path: str, arrays: Sequence[Any]) -> str:
    """``arrays`` (e.g. a program's outputs) written at exactly ``path``, whole or not at all: one
    array as a .npy file, several as a .npz file. Returns the format written."""
    import io

    import numpy as np

    from qlower.program.fileformat import write_atomically

    buf = io.BytesIO()
    if len(arrays) == 1:
        np.save(buf, np.asarray(arrays[0]), allow_pickle=False)
    else:
        np.savez(buf, *arrays)
    write_atomically(path, buf.getvalue())
    return ".npy" if len(arrays) == 1 else ".npz"
