"""Forged program files (issue 30): float fallbacks that would crash ATen, programs that would
exhaust the machine, subgraphs the reference can't run. Each must end in a QlowerError (exit
code 2 on the CLI), never a process killed by a signal, a hang or a result. The crash cases run
in a subprocess, so that a regression fails the test instead of killing pytest."""

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import qlower
from qlower.errors import InvalidProgramError
from qlower.program.fileformat import program_from_bytes
from qlower.testing import hostile

ENV = {**os.environ, "TOSA_MODEL_NO_BACKTRACE": "1"}

_CHILD = textwrap.dedent("""
    import json, sys
    from qlower.api import lower_graph
    from qlower.errors import QlowerError
    from qlower.program.fileformat import program_from_bytes
    from qlower.testing import hostile

    rows = []
    for target in sys.argv[1:]:
        for label, forge, _ in hostile.FALLBACKS:
            print(target, label, file=sys.stderr, flush=True)   # the last line names a case that killed us
            data, inputs = forge()
            try:
                prog = program_from_bytes(data)
            except QlowerError as e:
                rows.append([target, label, "load", type(e).__name__, str(e)[-200:]])
                continue
            try:
                lower_graph(prog.graph, target).run(*inputs)
                rows.append([target, label, "ran", "", ""])
            except QlowerError as e:
                rows.append([target, label, "run", type(e).__name__, str(e)[-200:]])
    print(json.dumps(rows))
""")


def test_forged_fallbacks_are_refused_and_never_kill_the_process():
    targets = ["reference", "cpu"]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *targets], capture_output=True, text=True, timeout=600,
                          env=ENV)
    assert proc.returncode == 0, f"the process died (code {proc.returncode}) after: {proc.stderr[-800:]}"
    rows = {(t, label): (stage, kind, message) for t, label, stage, kind, message in json.loads(proc.stdout)}
    assert set(rows) == {(t, label) for t in targets for label, _, _ in hostile.FALLBACKS}
    for (target, label), (stage, kind, message) in rows.items():
        when = next(w for name, _, w in hostile.FALLBACKS if name == label)
        assert stage == when, f"{target} {label}: refused at {stage!r} ({message}), expected at {when!r}"
        assert kind == ("InvalidProgramError" if when == "load" else "ExecutionError"), (target, label, kind)


def test_the_crash_cases_exit_with_code_2_on_the_cli(tmp_path):
    for name, forge in (("pool", hostile.pool_backward), ("div", hostile.int_min_div)):
        data, inputs = forge()
        path = tmp_path / f"{name}.qlp"
        path.write_bytes(data)
        args = []
        for i, x in enumerate(inputs):
            np.save(tmp_path / f"{name}{i}.npy", x)
            args += ["--input", str(tmp_path / f"{name}{i}.npy")]
        proc = subprocess.run([sys.executable, "-m", "qlower.cli", "run", str(path), *args], capture_output=True,
                              text=True, timeout=300, env=ENV)
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr[-500:])
        assert ("forward pass" if name != "div" else "-2147483648 by -1") in proc.stderr, proc.stderr[-500:]


def test_a_fallback_guard_checks_what_the_op_really_reads():
    """The guards refuse only what ATen can't take: in-range indices and ordinary divisions run, and
    give eager PyTorch's numbers."""
    import torch

    data, _ = hostile._one_call("aten.gather.default", [hostile.Operand(0), 0, hostile.Operand(1)], {},
                                [hostile.floats((3,)), hostile.plain_int((4,))], ("float32", "int64"),
                                hostile.floats((4,)), "float32", [])()
    x, idx = np.array([1.5, -2.0, 7.0], np.float32), np.array([2, 0, 0, 1], np.int32)
    got = program_from_bytes(data).run(x, idx)[0]
    np.testing.assert_array_equal(got, torch.gather(torch.from_numpy(x), 0, torch.from_numpy(idx).long()).numpy())
    data, _ = hostile._one_call("aten.div.Tensor", [hostile.Operand(0), hostile.Operand(1)], {},
                                [hostile.plain_int((3,)), hostile.plain_int((3,))], ("int32", "int32"),
                                hostile.floats((3,)), "float32", [])()    # true division: by zero is inf
    a, b = np.array([7, -2**31, 0], np.int32), np.array([0, -1, 0], np.int32)
    np.testing.assert_array_equal(program_from_bytes(data).run(a, b)[0],
                                  torch.div(torch.from_numpy(a), torch.from_numpy(b)).numpy())
    data, _ = hostile.int_min_div()
    a = np.array([7, -2**31 + 1], np.int32)
    np.testing.assert_array_equal(program_from_bytes(data).run(a)[0], np.array([-7, 2**31 - 1], np.int32))


# -- resources ----------------------------------------------------------------------------------

_BASE = [0]


def _rss_line(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the process's peak resident size (VmHWM)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    _BASE[0] = _rss_line("VmRSS:")


def _peak_rss_growth() -> int:
    return _rss_line("VmHWM:") - _BASE[0]


def test_hours_of_work_from_a_small_file_are_refused_at_load(monkeypatch):
    data, _ = hostile.huge_matmuls(8192, 3)          # 3 x 2**39 multiply-accumulates, from ~2 KB
    assert len(data) < 10_000
    with pytest.raises(InvalidProgramError, match=r"1,649,267,441,664 multiply-accumulates.*QLOWER_MAX_PROGRAM_MACS"):
        program_from_bytes(data)
    small, _ = hostile.huge_matmuls(64, 4)           # 4 x 64**3 = 1,048,576
    monkeypatch.setenv("QLOWER_MAX_PROGRAM_MACS", "1000000")
    with pytest.raises(InvalidProgramError, match="1,048,576 multiply-accumulates"):
        program_from_bytes(small)
    monkeypatch.setenv("QLOWER_MAX_PROGRAM_MACS", "1048576")   # the user raises the limit: it loads
    assert program_from_bytes(small).graph.ops


def test_gigabytes_of_aten_full_are_refused_at_load_without_allocating(monkeypatch):
    data, _ = hostile.many_fulls(1.0, 6)
    _reset_peak_rss()
    with pytest.raises(InvalidProgramError, match=r"7,516,192,772 bytes .* QLOWER_MAX_PROGRAM_MEMORY"):
        program_from_bytes(data)
    assert _peak_rss_growth() < 512 << 20     # checking the calls made no real 1 GiB tensor
    small, inputs = hostile.many_fulls(1 / 1024, 3)   # 3 x 1 MiB alive at once, plus the sums
    monkeypatch.setenv("QLOWER_MAX_PROGRAM_MEMORY", str(3 << 20))
    with pytest.raises(InvalidProgramError, match="QLOWER_MAX_PROGRAM_MEMORY"):
        program_from_bytes(small)
    monkeypatch.setenv("QLOWER_MAX_PROGRAM_MEMORY", str(5 << 20))
    np.testing.assert_array_equal(program_from_bytes(small).run(*inputs)[0], np.full(1 << 18, 3.0, np.float32))


@pytest.mark.parametrize("threads", [4096, 2**40, "many"])
def test_thread_counts_are_bounded_at_load_as_at_run(threads, monkeypatch):
    data, _ = hostile.program_threads(threads)
    with pytest.raises(InvalidProgramError, match=r"threads must be null or an integer in \[1, 256\]"):
        program_from_bytes(data)
    with pytest.raises(InvalidProgramError, match="litert payload meta threads"):
        program_from_bytes(hostile.payload_threads("litert", threads))
    if threads == 4096:     # the user allows more: the same files load
        monkeypatch.setenv("QLOWER_MAX_THREADS", "4096")
        assert program_from_bytes(data).meta["threads"] == 4096
        assert program_from_bytes(hostile.payload_threads("litert", 4096)).partitions


def test_the_checksum_is_verified_while_streaming_without_holding_the_file_twice(tmp_path):
    size = 48 << 20
    path = tmp_path / "big.qlp"
    with open(path, "wb") as f:
        f.write(hostile._HEAD.pack(b"\x89QLOWER\n", 1, size, b"\1" * 32))
        f.write(np.random.default_rng(30).integers(0, 256, size, dtype=np.uint8).tobytes())
    tracemalloc.start()
    try:
        with pytest.raises(InvalidProgramError, match="checksum mismatch"):
            qlower.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size <= peak < size * 1.25     # one buffer for the body, no second copy


def test_a_loaded_program_holds_its_tensors_once(tmp_path):
    """The arrays of a loaded program are views of the one buffer read from the file."""
    from qlower.api import lower_graph

    path = tmp_path / "p.qlp"
    lower_graph(hostile.small_int8_graph(), "reference").save(path)
    prog = qlower.load(path)
    arrays = [op.attrs["data"] for op in prog.graph.ops if op.kind == "constant"]
    assert len(arrays) == 2 and not any(a.flags.owndata or a.flags.writeable for a in arrays)
    def owner(a):
        while isinstance(a, np.ndarray):
            a = a.base
        return id(a.obj) if isinstance(a, memoryview) else id(a)
    owners = {owner(a) for a in arrays}
    assert len(owners) == 1, "each constant should be a view of the one buffer read from the file"


# -- subgraphs the reference can't run ------------------------------------------------------------

@pytest.mark.parametrize("target", ["reference", "litert", "tosa-1.0+int"])
@pytest.mark.parametrize("what,message", [("bias", "beyond the int32 accumulator"),
                                          ("clamp", r"max 1000 is outside int8 \[-128, 127\]"),
                                          ("dilation", r"dilation \(-1, 1\) must hold integers >= 1")])
def test_a_subgraph_the_reference_cant_run_is_refused_on_every_target(target, what, message):
    with pytest.raises(InvalidProgramError, match=message):
        program_from_bytes(hostile.verifier_forgery(target, what))


def test_a_program_target_is_known_and_that_of_its_partitions():
    """A header flip turned 'tosa-1.0+int' into 'tosa-1>0+int' and the program loaded under that name
    (the campaign of benchmarks/hostile_inputs.py); another real target than its partitions' too."""
    from qlower.api import lower_graph
    from qlower.program.fileformat import program_to_bytes

    data = program_to_bytes(lower_graph(hostile.small_int8_graph(), "tosa-1.0+int"))
    assert program_from_bytes(data).target == "tosa-1.0+int"
    for forged, why in (("tosa-1>0+int", "not one of qlower's targets"), ("tosa-1.0+int+fp", "lowered for")):
        with pytest.raises(InvalidProgramError, match=why):
            program_from_bytes(hostile.edit_header(data, lambda h, t=forged: h.__setitem__("target", t)))
