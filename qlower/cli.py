"""The ``qlower`` command line. It only calls the public API.

Exit codes: 0 success; 1 a verification that ran and found the program not exact; 2 anything
else that went wrong (a usage error, a bad model factory or input, an invalid program file, a
failed compile or run, running out of memory), with a short message on stderr. Text that comes
from a program file (names, metadata) is printed with control characters escaped, never raw.
Files are read only when regular (never a FIFO or device) and written only to regular files
or new paths (safe_paths.py).
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import unicodedata
from pathlib import Path

import numpy as np

import qlower
from qlower import model_spec
from qlower.errors import ConfigError, InputError, QlowerError
from qlower.safe_paths import check_destination, open_regular

# an --input .npy may declare at most this many bytes (a header can claim any shape)
MAX_INPUT_BYTES_ENV = "QLOWER_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 4 << 30


class UsageError(ConfigError):
    """A command line that can't be carried out as given (exit 2, message without a traceback)."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (its own prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, printable(f"{self.prog}: {message} (see {self.prog} --help)") + "\n")


def printable(text: object) -> str:
    """``text`` with every control or format character but newline and tab escaped (``\\x1b``):
    escape sequences from an untrusted file must not drive the user's terminal."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co")
                   else ascii(c)[1:-1] for c in str(text))


def say(*parts: object, file=None) -> None:
    stream = file or sys.stdout
    text = printable(" ".join(str(p) for p in parts))
    try:
        print(text, file=stream)
    except UnicodeEncodeError:   # a terminal whose encoding lacks a character: escaped, never a crash
        print(text.encode(stream.encoding or "ascii", "backslashreplace").decode(stream.encoding or "ascii"),
              file=stream)


def write_file(path: str | os.PathLike, data: bytes | str) -> None:
    """``data`` at ``path``, whole or not at all, only over a regular file (safe_paths.py)."""
    qlower.write_atomically(path, data.encode() if isinstance(data, str) else data)


def writable(path: str | None) -> str | None:
    """``path`` when qlower may write it (new, or a regular file): checked before the work."""
    if path is not None:
        check_destination(path)
    return path


def max_input_bytes() -> int:
    raw = os.environ.get(MAX_INPUT_BYTES_ENV)
    if raw is None:
        return DEFAULT_MAX_INPUT_BYTES
    if not raw.isdigit():
        raise ConfigError(f"{MAX_INPUT_BYTES_ENV}={raw!r}: expected a number of bytes")
    return int(raw)


def read_npy(path: str) -> np.ndarray:
    """An --input array: a regular .npy file whose header declares no more bytes than it holds
    (nor than ``QLOWER_MAX_INPUT_BYTES``), read without pickles; InputError otherwise."""
    from numpy.lib import format as npy

    with open_regular(path, "--input") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            version = npy.read_magic(f)
            header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _, dtype = header(f)
        except (ValueError, OSError, EOFError, SyntaxError) as e:
            raise InputError(f"--input {path}: not a readable .npy file ({e})") from None
        if dtype.hasobject:
            raise InputError(f"--input {path}: holds Python objects ({dtype}); qlower reads numeric arrays only")
        declared = math.prod(shape) * dtype.itemsize
        if declared > size - f.tell() or declared > max_input_bytes():
            raise InputError(f"--input {path}: its header declares a {dtype}{list(shape)} array ({declared:,} bytes), "
                             f"the file holds {max(size - f.tell(), 0):,} bytes of data"
                             + (f" and the limit is {max_input_bytes():,} ({MAX_INPUT_BYTES_ENV})"
                                if declared > max_input_bytes() else ""))
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise InputError(f"--input {path}: not a readable .npy file ({e})") from None


def _load_model(spec: str, size: int | None, trained: bool = False):
    """``zoo:NAME`` or ``path/to/file.py:factory`` → (model, example_inputs, quant, calibration)."""
    try:
        return model_spec.load(spec, size=size, trained=trained)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def cmd_zoo(args) -> int:
    from qlower import zoo

    for name in zoo.names():
        description = zoo.trained_description(name)
        trained = f" [--trained: {description}, trained on digits 3x32x32 → 10]" if description else ""
        say(f"{name:22s} {zoo.describe(name)}{trained}")
    return 0


def cmd_targets(args) -> int:
    say("\n".join(qlower.targets()))
    return 0


def _options(target: str, pairs: list[str]) -> dict[str, object]:
    """KEY=VALUE strings as the target's backend options, typed as its backend declares them."""
    texts: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option takes KEY=VALUE, got {pair!r}")
        texts[key] = value
    return qlower.parse_backend_options(target, texts)


def cmd_verify(args) -> int:
    model, example, quant, calib = _load_model(args.model, args.size, args.trained)
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib,
                          verify_passes=args.verify_passes, trace=True, backend_options=_options(args.target, args.option))
    report = qlower.verify_program(prog, [example])
    say(report.table())
    if args.json:
        write_file(args.json, report.to_json())
    if args.html:
        say(f"HTML report: {report.write_html(args.html)}")
    return 0 if report.ok else 1


def cmd_compile(args) -> int:
    if args.format == "tflite" and not args.output:
        raise UsageError("--format tflite needs -o FILE.tflite")
    model, example, quant, calib = _load_model(args.model, args.size, args.trained)
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib,
                          verify_passes=args.verify_passes, backend_options=_options(args.target, args.option))
    say(prog.explain())
    if args.output and args.format == "tflite":   # the target's backend says what the file is (export_note)
        say(f"wrote {prog.export(args.output, format='tflite')} ({prog.export_note('tflite')})")
        # TFLM needs each operator registered: the list is generated, never typed
        tflite_file = Path(args.output)
        header = tflite_file.with_name(f"{tflite_file.stem}_ops.h")
        write_file(header, qlower.op_resolver_header(tflite_file.read_bytes(), tflite_file.name))
        say(f"wrote {header} (the operators to register in TFLM's MicroMutableOpResolver)")
    elif args.output:
        prog.save(args.output)
        say(f"wrote {args.output}")
    if args.artifacts:
        out = Path(args.artifacts)
        for name, blob in prog.artifacts().items():
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_file(dest, blob)
        write_file(out / "summary.json", json.dumps(prog.summary(), indent=2, default=str))
        say(f"wrote {len(prog.artifacts())} artifact(s) and summary.json to {out}")
    return 0


def cmd_run(args) -> int:
    prog = qlower.load(args.program)
    inputs = [read_npy(path) for path in args.input]
    for note in sorted({str(p.payload.execution) for p in prog.partitions if p.payload.execution is not None}):
        say(f"note: {note}")
    outs = prog.run(*inputs)
    for i, o in enumerate(outs):
        say(f"output {i}: {o.dtype}{list(o.shape)}  min {o.min():.6g}  max {o.max():.6g}")
    if args.output:
        # written to exactly this path (NumPy would append .npy/.npz to a name without it)
        kind = qlower.save_arrays(args.output, outs)
        say(f"wrote {args.output} ({kind if len(outs) == 1 else f'{kind} of {len(outs)} arrays'})")
    return 0


def cmd_accuracy(args) -> int:
    """A trained zoo model's top-1 accuracy on its held-out split: fp32, fake-quant and the target."""
    from dataclasses import replace

    from qlower import zoo

    if not args.model.startswith("zoo:"):
        raise UsageError(f"accuracy takes a trained zoo model (zoo:NAME, one of {', '.join(zoo.trained_names())}), "
                         f"got {args.model!r}; from Python, qlower.evaluate(model, example_inputs, (inputs, labels)) "
                         "measures any model")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    if args.auto_int16 is not None and args.auto_int16 < 1:
        raise UsageError(f"--auto-int16 must be at least 1, got {args.auto_int16}")
    name = args.model[4:]
    model, example, quant, calib = _load_model(args.model, None, trained=True)
    configs = [("int8", quant)]
    if args.act_dtype == "int16":
        configs.append(("A16W8 (int16 activations)", replace(quant, act_dtype="int16")))
    if args.auto_int16:
        configs.append((f"auto_int16={args.auto_int16}", replace(quant, auto_int16=args.auto_int16)))
    reports = []
    for label, config in configs:
        prog = qlower.compile(model, example, target=args.target, quant=config, calibration=calib,
                              backend_options=_options(args.target, args.option))
        promoted = prog.meta.get("auto_int16")
        reports.append(qlower.measure_accuracy(prog, zoo.held_out(name), limit=args.limit, label=label,
                                        detail=f"int16: {', '.join(promoted)}" if promoted else ""))
    say(f"{name}, trained on digits")
    say(reports[0].table() if len(reports) == 1 else qlower.comparison_table(reports))
    if args.json:
        write_file(args.json, json.dumps([json.loads(r.to_json()) for r in reports], indent=2))
    return 0


def cmd_sensitivity(args) -> int:
    """Each layer alone in int8, ranked by output SQNR (and accuracy, for trained zoo models)."""
    from qlower import zoo

    trained = args.model.startswith("zoo:") and args.model[4:] in zoo.trained_names()
    model, example, quant, calib = _load_model(args.model, args.size if not trained else None, trained)
    data = zoo.held_out(args.model[4:]) if trained else None
    report = qlower.sensitivity(model, example, quant, calib, data, limit=args.limit)
    say(report.table(args.top))
    if args.plot:
        say(f"plot: {report.plot(args.plot)}")
    if args.json:
        write_file(args.json, report.to_json())
    return 0


def cmd_sweep(args) -> int:
    """Models × targets × configurations, compiled and measured in parallel (qlower.sweep)."""
    from qlower import sweep

    if args.spec and (args.models or args.targets):
        raise UsageError("give a SPEC.toml or --models/--targets, not both")
    if args.spec:
        jobs = sweep.load_spec(args.spec)
    elif args.models and args.targets:
        jobs = sweep.grid_from_text(args.models.split(","), args.targets.split(","), quant=args.quant,
                                    options=args.option, measures=args.measure, size=args.size, trained=args.trained)
    else:
        raise UsageError("sweep takes a SPEC.toml, or --models and --targets")
    ray = True if args.ray == "" else args.ray
    result = sweep(jobs, workers=args.workers, ray=ray, cache=False if args.no_cache else True)
    say(result.table())
    if args.json:
        say(f"JSON: {result.write_json(args.json)}")
    if args.html:
        say(f"HTML: {result.write_html(args.html)}")
    return 0 if result.ok else 1


def cmd_inspect(args) -> int:
    say(json.dumps(qlower.inspect_program(args.program), indent=2, default=str))
    return 0


def cmd_view(args) -> int:
    from qlower.view import serve

    serve(args.program, report=args.report, port=args.port, open_browser=not args.no_browser)
    return 0


def _percent(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


def cmd_demo(args) -> int:
    """Digits CNN: fp32 vs int8 accuracy on held-out digits, then the verification table."""
    from qlower import zoo

    model, example, quant, calib = zoo.get("digits_cnn")
    say(f"compiling digits_cnn for {args.target} (static int8, {len(calib)} calibration batches)…")
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib, trace=True)
    held_out = zoo.held_out("digits_cnn")
    accuracy = qlower.measure_accuracy(prog, held_out)
    say(f"held-out digits: {accuracy.images} images")
    say(f"  fp32 accuracy  {_percent(accuracy.fp32)}")
    say(f"  int8 accuracy  {_percent(accuracy.program)}  ({args.target})")
    report = qlower.verify_program(prog, [(held_out.inputs[0][:1],)])
    say(report.table())
    return 0 if report.ok else 1


# PyTorch's CPU allocator fails with a plain RuntimeError (c10::Error), no type of its own: its
# words are the last resort, matched on RuntimeErrors only
_CPU_ALLOCATOR_TEXTS = ("DefaultCPUAllocator: can't allocate memory", "Error code 12 (Cannot allocate memory)")


def _allocation_failed(e: BaseException) -> bool:
    """Whether ``e`` itself says an allocation failed: by its type where it has one (MemoryError,
    which NumPy's _ArrayMemoryError is; torch.OutOfMemoryError of the accelerator allocators; an
    OSError of ENOMEM), else by PyTorch's CPU allocator's words on a RuntimeError."""
    torch = sys.modules.get("torch")   # not imported: none of its errors can be here
    if isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError)):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:
        return True
    return type(e) is RuntimeError and any(t in str(e) for t in _CPU_ALLOCATOR_TEXTS)


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` or an error it wraps (e.g. a capture failure raised from the allocator's) is an
    allocation that failed."""
    seen = 0
    while e is not None and seen < 8:
        if _allocation_failed(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _one_line(e: BaseException) -> str:
    """The whole message on one line (its lines joined by "; ")."""
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:200] + "…"


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="qlower", description=qlower.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile the digits CNN, compare fp32 and int8 accuracy, verify")
    d.add_argument("--target", default="cpu")
    d.set_defaults(fn=cmd_demo)
    sub.add_parser("zoo", help="list the built-in models").set_defaults(fn=cmd_zoo)
    sub.add_parser("targets", help="list the targets").set_defaults(fn=cmd_targets)
    for name, fn, helptext in (("verify", cmd_verify, "run every stage and compare per layer"),
                               ("compile", cmd_compile, "compile a model and write its artifacts")):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("model", help="zoo:NAME or FILE.py:FACTORY")
        # verify: by default the fast CPU program against the reference (target reference runs
        # the reference interpreter itself, which leaves nothing to compare it with)
        c.add_argument("--target", default="cpu" if name == "verify" else "reference")
        c.add_argument("--size", type=int, default=None, help="input size for image models")
        c.add_argument("--verify-passes", action="store_true", help="run the IR verifier after every pass")
        c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a backend option, e.g. system_config=Ethos_U85_SYS_DRAM_High (repeat for several)")
        c.add_argument("--trained", action="store_true",
                       help="the zoo model's trained weights (digits at 32x32; see `qlower zoo`)")
        if name == "verify":
            c.add_argument("--json", help="also write the report as JSON")
            c.add_argument("--html", help="also write the HTML report (per-layer error plot, partitioning)")
        else:
            c.add_argument("-o", "--output", help="write the program file (or, with --format tflite, the .tflite) here")
            c.add_argument("--format", choices=("qlp", "tflite"), default="qlp",
                           help="qlp: a qlower program file (default); tflite: the whole program as one TFLite "
                                "model for LiteRT (compile for --target litert to match its kernels)")
            c.add_argument("--artifacts", help="also export the backends' files (e.g. .tosa) to this directory")
        c.set_defaults(fn=fn)
    a = sub.add_parser("accuracy", help="a trained zoo model's accuracy: fp32, fake-quant and the target's")
    a.add_argument("model", help="zoo:NAME, a model with trained weights")
    a.add_argument("--target", default="cpu")
    a.add_argument("--limit", type=int, default=None, help="measure the first N held-out inputs only")
    a.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a backend option")
    a.add_argument("--act-dtype", choices=("int8", "int16"), default="int8",
                   help="int16: also measure A16W8 (int16 activations, int8 weights) beside int8")
    a.add_argument("--auto-int16", type=int, default=None, metavar="K",
                   help="also measure int8 with its K most int8-sensitive layers in int16")
    a.add_argument("--json", help="also write the result as JSON (a list, a configuration each)")
    a.set_defaults(fn=cmd_accuracy)
    sens = sub.add_parser("sensitivity", help="rank the layers by what int8 costs each alone (output SQNR, accuracy)")
    sens.add_argument("model", help="zoo:NAME (trained weights and held-out digits when it has them) or FILE.py:FACTORY")
    sens.add_argument("--size", type=int, default=None, help="input size for untrained image models")
    sens.add_argument("--limit", type=int, default=None, help="measure on the first N held-out inputs only")
    sens.add_argument("--top", type=int, default=20, help="rows to print (default 20)")
    sens.add_argument("--plot", help="also draw the ranking as a PNG bar chart")
    sens.add_argument("--json", help="also write the ranking as JSON")
    sens.set_defaults(fn=cmd_sensitivity)
    sw = sub.add_parser("sweep", help="models × targets × configurations in parallel, cached (local or Ray)")
    sw.add_argument("spec", nargs="?", help="a TOML spec (a [grid] and/or [[job]] list); or use --models/--targets")
    sw.add_argument("--models", help="comma-separated zoo:NAME / FILE.py:FACTORY")
    sw.add_argument("--targets", help="comma-separated targets")
    sw.add_argument("--size", type=int, default=None, help="input size for image models")
    sw.add_argument("--trained", action="store_true", help="zoo models' trained weights (top-1 accuracy)")
    sw.add_argument("--quant", action="append", default=[], metavar="FIELD=V[,V]",
                    help="a QuantConfig field, several values an axis (repeat for several)")
    sw.add_argument("--option", action="append", default=[], metavar="KEY=V[,V]",
                    help="a backend option for the targets that take it, several values an axis")
    sw.add_argument("--measure", default="verify", help="comma-separated: compile, verify, accuracy, cycles, latency")
    sw.add_argument("--workers", type=int, default=None, help="local processes at once (default: the cores)")
    sw.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run on Ray (pip install 'qlower[ray]'): a cluster's address, 'auto', or none for a local one")
    sw.add_argument("--no-cache", action="store_true", help="recompute every job and keep nothing")
    sw.add_argument("--json", help="also write the rows as JSON")
    sw.add_argument("--html", help="also write the HTML page (sortable table, Pareto plot)")
    sw.set_defaults(fn=cmd_sweep)
    r = sub.add_parser("run", help="run a program file on .npy inputs")
    r.add_argument("program")
    r.add_argument("--input", action="append", default=[], help="an input as .npy (repeat for several)")
    r.add_argument("--output", help="write the output(s) as .npy / .npz")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("view", help="open a program file's graph in Model Explorer (partitions, host ops, "
                                    "per-layer error with --report)")
    v.add_argument("program", help="a program file (.qlp)")
    v.add_argument("--report", help="a verification report (qlower verify --json) to overlay per node")
    v.add_argument("--port", type=int, default=None, help="the server's port (default: the first free from 8080)")
    v.add_argument("--no-browser", action="store_true", help="print the URL only; don't open a browser")
    v.set_defaults(fn=cmd_view)
    i = sub.add_parser("inspect", help="show a program file's targets, partitions, I/O types and sizes")
    i.add_argument("program")
    i.set_defaults(fn=cmd_inspect)
    args = p.parse_args(argv)
    try:
        for name in ("output", "json", "html", "plot"):   # refused before the work, not after
            writable(getattr(args, name, None))
        return args.fn(args)
    except BrokenPipeError:   # `qlower zoo | head -1`: the reader has all it wants
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # Python's flush at exit must not fail again
        return 0
    except UsageError as e:
        say(f"qlower: {_one_line(e)}", file=sys.stderr)
        return 2
    except (MemoryError, QlowerError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and not _out_of_memory(e):
            if isinstance(e, QlowerError):   # one line: a multi-line message (a verifier's list) joined
                say(f"qlower: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
                return 2
            raise
        say(f"qlower: out of memory ({_first_line(e) or type(e).__name__}): the model, its inputs or a program's "
            "tensors need more memory than this process may have; try smaller inputs (--size) or a machine with "
            "more memory", file=sys.stderr)
        return 2
    except UnicodeError as e:   # e.g. a lone surrogate in a name, which no file or terminal can hold
        say(f"qlower: text that is not valid Unicode: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # a bad argument (unknown target or option, missing or unreadable file)
        say(f"qlower: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
