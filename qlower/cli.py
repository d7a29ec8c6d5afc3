"""The ``qlower`` command line. It only calls the public API."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

import qlower
from qlower.errors import QlowerError


def _load_model(spec: str, size: int | None):
    """``zoo:NAME`` or ``path/to/file.py:factory`` → (model, example_inputs, quant, calibration)."""
    if spec.startswith("zoo:"):
        from qlower import zoo

        return zoo.get(spec[4:], size=size)
    path, _, factory = spec.rpartition(":")
    if not path or not Path(path).is_file():
        raise SystemExit(f"qlower: {spec!r} is neither zoo:NAME nor FILE.py:FACTORY")
    mod_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    result = getattr(module, factory)()
    if isinstance(result, tuple) and len(result) == 4:
        return result
    model, example_inputs = result
    return model, example_inputs, qlower.QuantConfig(), [example_inputs]


def cmd_zoo(args) -> int:
    from qlower import zoo

    for name in zoo.names():
        print(f"{name:22s} {zoo.describe(name)}")
    return 0


def cmd_targets(args) -> int:
    from qlower.backends.registry import targets

    print("\n".join(targets()))
    return 0


def _options(pairs: list[str]) -> dict[str, object]:
    """KEY=VALUE strings as backend options; true/false become booleans."""
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"qlower: --option takes KEY=VALUE, got {pair!r}")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


def cmd_verify(args) -> int:
    model, example, quant, calib = _load_model(args.model, args.size)
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib,
                          verify_passes=args.verify_passes, trace=True, backend_options=_options(args.option))
    from qlower.verify import verify_program

    report = verify_program(prog, [example])
    print(report.table())
    if args.json:
        Path(args.json).write_text(report.to_json())
    if args.html:
        print(f"HTML report: {report.write_html(args.html)}")
    return 0 if report.ok else 1


def cmd_compile(args) -> int:
    if args.format == "tflite" and not args.output:
        print("qlower: --format tflite needs -o FILE.tflite", file=sys.stderr)
        return 2
    model, example, quant, calib = _load_model(args.model, args.size)
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib,
                          verify_passes=args.verify_passes, backend_options=_options(args.option))
    print(prog.explain())
    if args.output and args.format == "tflite":
        from qlower.backends.litert.rounding import exact_kernels

        exact = exact_kernels(prog.source)
        where = (f"bit-exact with the reference interpreter under LiteRT's {' and '.join(exact)} kernels" if exact
                 else "its requantization rounds as no LiteRT kernels are guaranteed to: compile with --target "
                      "litert (--option kernels=...) for a file LiteRT reproduces exactly")
        print(f"wrote {prog.export(args.output, format='tflite')} (TFLite, for LiteRT); {where}")
    elif args.output:
        prog.save(args.output)
        print(f"wrote {args.output}")
    if args.artifacts:
        out = Path(args.artifacts)
        for name, blob in prog.artifacts().items():
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob)
        (out / "summary.json").write_text(json.dumps(prog.summary(), indent=2, default=str))
        print(f"wrote {len(prog.artifacts())} artifact(s) and summary.json to {out}")
    return 0


def cmd_run(args) -> int:
    prog = qlower.load(args.program)
    inputs = [np.load(p, allow_pickle=False) for p in args.input]
    for note in sorted({p.payload.meta.get("execution") for p in prog.partitions} - {None}):
        print(f"note: {note}")
    outs = prog.run(*inputs)
    for i, o in enumerate(outs):
        print(f"output {i}: {o.dtype}{list(o.shape)}  min {o.min():.6g}  max {o.max():.6g}")
    if args.output:
        if len(outs) == 1:
            np.save(args.output, outs[0], allow_pickle=False)
        else:
            np.savez(args.output, *outs)
        print(f"wrote {args.output}")
    return 0


def cmd_inspect(args) -> int:
    from qlower.program.fileformat import inspect_program

    print(json.dumps(inspect_program(args.program), indent=2, default=str))
    return 0


def cmd_demo(args) -> int:
    """Digits CNN: fp32 vs int8 accuracy on held-out digits, then the verification table."""
    import torch

    from qlower import zoo
    from qlower.verify import verify_program

    model, example, quant, calib = zoo.get("digits_cnn")
    _, _, x_test, y_test = zoo.digits.dataset()
    print(f"compiling digits_cnn for {args.target} (static int8, {len(calib)} calibration batches)…")
    prog = qlower.compile(model, example, target=args.target, quant=quant, calibration=calib, trace=True)
    with torch.no_grad():
        fp32_pred = model(x_test).argmax(dim=1).numpy()
    int8_pred = np.array([int(np.argmax(prog.run(x_test[i:i + 1])[0])) for i in range(len(x_test))])
    y = y_test.numpy()
    fp32_acc, int8_acc = float(np.mean(fp32_pred == y)), float(np.mean(int8_pred == y))
    print(f"held-out digits: {len(y)} images")
    print(f"  fp32 accuracy  {100 * fp32_acc:.2f}%")
    print(f"  int8 accuracy  {100 * int8_acc:.2f}%  ({args.target})")
    report = verify_program(prog, [(x_test[:1],)])
    print(report.table())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qlower", description=qlower.__doc__)
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
        c.add_argument("--target", default="reference")
        c.add_argument("--size", type=int, default=None, help="input size for image models")
        c.add_argument("--verify-passes", action="store_true", help="run the IR verifier after every pass")
        c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a backend option, e.g. system_config=Ethos_U85_SYS_DRAM_High (repeat for several)")
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
    r = sub.add_parser("run", help="run a program file on .npy inputs")
    r.add_argument("program")
    r.add_argument("--input", action="append", default=[], help="an input as .npy (repeat for several)")
    r.add_argument("--output", help="write the output(s) as .npy / .npz")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="show a program file's targets, partitions, I/O types and sizes")
    i.add_argument("program")
    i.set_defaults(fn=cmd_inspect)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except QlowerError as e:
        print(f"qlower: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # a bad argument (unknown target or option, missing or unreadable file)
        print(f"qlower: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
