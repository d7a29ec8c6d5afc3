"""Hostile program files (issue 30): byte flips per blob per target, forged float fallbacks,
resource limits, subgraphs the reference can't run. Every case is loaded, and run when it
loads; each must be refused with a QlowerError or give the unaltered program's numbers.

Cases run in child processes, one after the other; a child killed by a signal counts the case
it was on as a crash, a case running past the time limit as a hang (the child is killed and the
next case runs in a fresh one). Prints a table and writes benchmarks/results/hostile_inputs.json.

    .venv/bin/python benchmarks/hostile_inputs.py [--flips 12] [--timeout 120]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

TARGETS = ("reference", "cpu", "litert", "tosa-1.0+int")
# byte flips: every target's payloads (cpu and reference have none: header and constants only); "+trace"
# compiles with trace=True, which adds the traced files (VGF's trace.vgf, a traced TOSA graph)
FLIP_TARGETS = TARGETS + ("ethos-u55-128", "ethos-u85-256", "vgf", "vgf+trace", "tflm")
RESULTS = Path(__file__).parent / "results" / "hostile_inputs.json"


# -- the cases (built in the child: the same list in every child, by seed) ------------------------

def _flip_cases(flips: int):
    import numpy as np

    from qlower.api import lower_graph
    from qlower.program.fileformat import program_to_bytes
    from qlower.testing import hostile

    rng = np.random.default_rng(30)
    x = rng.integers(-128, 128, (1, 6, 6, 2)).astype(np.int8)
    graph = hostile.small_int8_graph()
    cases = []
    for target in FLIP_TARGETS:
        name = target.removesuffix("+trace")
        data = program_to_bytes(lower_graph(graph, name, trace=name != target))
        body = data[hostile._HEAD.size:]
        n = int.from_bytes(body[:8], "little")
        st = json.loads(body[8:8 + n])
        header = json.loads(st["__metadata__"]["qlower"])
        blobs = {f"{p['name']}/{name}": key for p in header["partitions"] for name, key in p["payload"]["blobs"].items()}
        regions = {"program header": (8, 8 + n)}
        for label, key in blobs.items():
            s, e = st[key]["data_offsets"]
            regions[f"blob {label}"] = (8 + n + s, 8 + n + e)
        # constants: the host graph's are the model itself (a changed weight is another model, which
        # only the file's checksum can tell, and a forger seals it again); a partition's are its payload's
        host = {op["attrs"]["data"]["tensor"] for op in header["host"]["ops"] if op["kind"] == "constant"}
        for label, keys in (("host constants", host), ("partition constants", set(st) - host - {"__metadata__"}
                                                                              - set(blobs.values()))):
            spans = [tuple(st[k]["data_offsets"]) for k in sorted(keys) if st[k]["data_offsets"][1] > st[k]["data_offsets"][0]]
            if spans:
                regions[label] = [(8 + n + a, 8 + n + b) for a, b in spans]
        for region, span in regions.items():
            spans = span if isinstance(span, list) else [span]
            for i in range(flips):
                s, e = spans[int(rng.integers(0, len(spans)))]
                at = int(rng.integers(s, e))
                bit = int(rng.integers(0, 8))

                def forge(data=data, at=at, bit=bit):
                    b = bytearray(data[hostile._HEAD.size:])
                    b[at] ^= 1 << bit
                    return hostile.seal(bytes(b)), [x]
                cases.append((f"flip {target} {region}", forge, data, [x], f"{i} (byte {at}, bit {bit})"))
    return cases


def _forged_cases():
    import numpy as np

    from qlower.api import lower_graph
    from qlower.program.fileformat import program_from_bytes
    from qlower.testing import hostile

    cases = []
    for target in ("reference", "cpu", "tosa-1.0+int"):
        for label, forge, _ in hostile.FALLBACKS:
            def run_on(forge=forge, target=target):
                data, inputs = forge()
                prog = program_from_bytes(data)
                return lower_graph(prog.graph, target), inputs
            cases.append((f"fallback on {target}", run_on, None, None, label))
    for name, forge in (("240 x 8192^3 aten.mm", lambda: hostile.huge_matmuls()),
                        ("6 x 1 GiB aten.full", lambda: hostile.many_fulls()),
                        ("program threads=4096", lambda: hostile.program_threads(4096)),
                        ("program threads=2**40", lambda: hostile.program_threads(2**40)),
                        ("litert threads=100000", lambda: (hostile.payload_threads("litert", 100000), [])),
                        ("litert threads=2**40", lambda: (hostile.payload_threads("litert", 2**40), []))):
        cases.append(("resource limits", forge, None, None, name))
    x = np.random.default_rng(31).integers(-128, 128, (1, 6, 6, 2)).astype(np.int8)
    for target in ("reference", "litert", "tosa-1.0+int"):
        for what in ("bias", "clamp", "dilation"):
            cases.append((f"verifier {target}", lambda t=target, w=what: (hostile.verifier_forgery(t, w), [x]),
                          None, None, what))
    return cases


def _checksum_case(tmp: Path):
    """A 256 MiB body with a wrong checksum: refused after one streamed pass."""
    from qlower.testing import hostile

    path = tmp / "big.qlp"
    size = 256 << 20
    with open(path, "wb") as f:
        f.write(hostile._HEAD.pack(b"\x89QLOWER\n", 1, size, b"\1" * 32))
        f.truncate(hostile._HEAD.size + size)
    return path


_WANT: dict = {}


def _cli_refusal(data: bytes, inputs: list, tmp: Path) -> dict:
    """``qlower run`` on the forged file: its exit code and how many lines it printed on stderr."""
    import contextlib
    import io

    import numpy as np

    from qlower.cli import main

    path, args = tmp / "forged.qlp", []
    path.write_bytes(data)
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", str(tmp / f"in{i}.npy")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", str(path), *args])
    return {"cli_exit": code, "cli_lines": len(err.getvalue().strip().splitlines())}


def _run_case(case, tmp: Path) -> dict:
    import numpy as np

    import qlower
    from qlower.errors import QlowerError
    from qlower.program.fileformat import program_from_bytes

    group, forge, original, inputs, tag = case
    t0 = time.perf_counter()
    data = None   # the forged file, when the case makes one (the CLI is run on it too)
    try:
        if group == "checksum":
            qlower.load(_checksum_case(tmp))
            return {"outcome": "accepted-different", "seconds": time.perf_counter() - t0}
        made = forge()
        if isinstance(made[0], (bytes, bytearray)):
            data, inputs = made
            try:
                prog = program_from_bytes(data)
            except QlowerError as e:
                return {"outcome": "refused", "stage": "load", "error": type(e).__name__, "message": str(e)[-160:],
                        **_cli_refusal(data, inputs, tmp)}
        else:
            prog, inputs = made
        got = prog.run(*inputs)
    except QlowerError as e:
        cli = _cli_refusal(data, inputs, tmp) if data is not None else {}
        return {"outcome": "refused", "stage": "run", "error": type(e).__name__, "message": str(e)[-160:], **cli}
    except Exception as e:  # noqa: BLE001 - a non-QlowerError is a finding, reported as such
        return {"outcome": "other-error", "error": type(e).__name__, "message": str(e)[-160:]}
    if original is None:
        return {"outcome": "accepted-different"}   # a forged call must never produce a result
    key = (id(original), *(x.tobytes() for x in inputs))
    if key not in _WANT:   # the unaltered program's numbers, once per program and inputs
        _WANT[key] = program_from_bytes(original).run(*inputs)
    want = _WANT[key]
    same = len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    return {"outcome": "accepted-exact" if same else "accepted-different"}


def child(flips: int, start: int, tmp: str) -> None:
    cases = _flip_cases(flips) + _forged_cases() + [("checksum", None, None, None, "256 MiB, bad checksum")]
    print(json.dumps({"count": len(cases)}), flush=True)
    for i in range(start, len(cases)):
        group, *_, tag = cases[i]
        print(json.dumps({"start": i, "group": group, "case": str(tag)}), flush=True)
        row = _run_case(cases[i], Path(tmp))
        print(json.dumps({"done": i, "group": group, "case": str(tag), **row}), flush=True)


# -- the parent: runs children, turns deaths and timeouts into rows ------------------------------

def campaign(flips: int, timeout: float) -> list[dict]:
    import tempfile

    rows: list[dict] = []
    start, count = 0, None
    env = {**os.environ, "TOSA_MODEL_NO_BACKTRACE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        while count is None or start < count:
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(start), "--flips", str(flips),
                                     "--tmp", tmp], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env=env)
            current, deadline = None, time.monotonic() + timeout * 4   # the first case also builds the list
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:   # a hang: the case ran past its time
                    proc.kill()
                    proc.wait()
                    rows.append({**(current or {"group": "?", "case": "?"}), "outcome": "hang"})
                    start = (current or {"start": start})["start"] + 1
                    break
                line = proc.stdout.readline()
                if not line:    # the child ended: normally, or killed by a signal
                    rc = proc.wait()
                    if current is not None:
                        rows.append({**current, "outcome": "crash", "signal": -rc if rc < 0 else None, "rc": rc})
                        start = current["start"] + 1
                    else:
                        start = count if count is not None else start
                        if count is None:
                            raise SystemExit(f"the campaign's child failed before its first case (rc {rc})")
                    break
                msg = json.loads(line)
                if "count" in msg:
                    count = msg["count"]
                elif "start" in msg:
                    current, deadline = msg, time.monotonic() + timeout
                elif "done" in msg:
                    rows.append({k: v for k, v in msg.items() if k != "done"})
                    current = None
                    print(f"\r{len(rows)}/{count} cases", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flips", type=int, default=12, help="byte flips per region (blob, header, constants)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take before it is a hang")
    ap.add_argument("--child", type=int, default=None)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    if args.child is not None:
        child(args.flips, args.child, args.tmp)
        return
    t0 = time.perf_counter()
    rows = campaign(args.flips, args.timeout)
    outcomes = ("refused", "accepted-exact", "accepted-different", "other-error", "crash", "hang")
    # the CLI on each refused file: exit 2 and one line, else counted in the last column
    columns = outcomes + ("cli not 2/1 line",)
    table: dict[str, dict[str, int]] = {}
    for r in rows:
        group = r["group"]   # flips: one line per target and region
        counts = table.setdefault(group, dict.fromkeys(columns, 0))
        counts[r["outcome"]] += 1
        counts[columns[-1]] += "cli_exit" in r and (r["cli_exit"] != 2 or r["cli_lines"] != 1)
    width = max(len(g) for g in table) + 2
    print(f"{'cases':<{width}}{'n':>6}" + "".join(f"{o:>19}" for o in columns))
    total = dict.fromkeys(columns, 0)
    for g, counts in table.items():
        print(f"{g:<{width}}{sum(counts[o] for o in outcomes):>6}" + "".join(f"{counts[o]:>19}" for o in columns))
        for o in columns:
            total[o] += counts[o]
    print(f"{'total':<{width}}{sum(total[o] for o in outcomes):>6}" + "".join(f"{total[o]:>19}" for o in columns))
    print(f"{time.perf_counter() - t0:.0f} s")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"command": "benchmarks/hostile_inputs.py " + " ".join(sys.argv[1:]),
                                   "table": table, "total": total, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
