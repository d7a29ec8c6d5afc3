"""Program files from anyone: altered payload bytes (checksum recomputed, as anyone can) are
refused at load, a crash of the native reference model is an ExecutionError that leaves the caller
alive, runs from many threads leave the process's descriptors alone, and valid-but-hostile graphs
are refused with a limit the user can raise."""

import hashlib
import json
import os
import random
import struct
import threading

import numpy as np
import pytest
import safetensors.numpy

import qlower
from qlower.backends.tosa import executor
from qlower.errors import ExecutionError, InvalidProgramError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program import Program
from qlower.program.fileformat import program_from_bytes, program_to_bytes
from qlower.reference import run_graph

HEAD = struct.Struct("<8sIQ32s")
FUZZ_EXAMPLES = int(os.environ.get("QLOWER_FUZZ_EXAMPLES", "40"))
Q = QuantSpec.per_tensor(0.05, 3)


def _graph():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 6, 6, 4), DType.INT8, Q))
    w = b.constant(np.arange(-32, 32, dtype=np.int8).reshape(4, 2, 2, 4), QuantSpec.per_tensor(0.02))
    acc = b.op("conv2d", x, w, None, name="acc")
    y = b.op("rescale", acc, out=QuantSpec.per_tensor(0.1, -2), name="y")
    return verify_graph(b.build([b.op("max_pool2d", y, kernel=(2, 2), stride=(1, 1), pad=(0, 0, 0, 0), name="pooled")]))


def _program(target: str) -> Program:
    from qlower.api import lower_graph

    return lower_graph(_graph(), target)


PROGRAMS = {t: _program(t) for t in ("tosa-1.0+int", "ethos-u85-256")}
X = np.random.default_rng(7).integers(-128, 128, (1, 6, 6, 4), dtype=np.int8)


def _blob_key(header: dict, blob: str) -> str:
    return header["partitions"][0]["payload"]["blobs"][blob]


def _with_blob(data: bytes, blob: str, change) -> bytes:
    """The file with ``change`` applied to a payload blob, checksum and all re-sealed."""
    body = data[HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    header = json.loads(json.loads(body[8:8 + n])["__metadata__"]["qlower"])
    arrays = dict(safetensors.numpy.load(body))
    key = _blob_key(header, blob)
    arrays[key] = np.frombuffer(change(arrays[key].tobytes()), np.uint8)
    header["tensors"][key]["shape"] = [int(arrays[key].size)]
    new_body = safetensors.numpy.save(arrays, metadata={"qlower": json.dumps(header)})
    return HEAD.pack(b"\x89QLOWER\n", 1, len(new_body), hashlib.sha256(new_body).digest()) + new_body


def _flip(offset: int, bit: int):
    def change(b: bytes) -> bytes:
        a = bytearray(b)
        a[offset % len(a)] ^= 1 << bit
        return bytes(a)
    return change


@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_a_saved_program_still_loads_and_runs_bit_exact(target):
    loaded = program_from_bytes(program_to_bytes(PROGRAMS[target]))
    expected = run_graph(_graph(), [X])[0]
    assert np.array_equal(loaded.run(X)[0], expected)


@pytest.mark.fuzz
@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_every_flipped_byte_of_graph_tosa_is_refused_at_load(target):
    data = program_to_bytes(PROGRAMS[target])
    size = len(PROGRAMS[target].partitions[0].payload.blobs["graph.tosa"])
    rng = random.Random(f"flip-{target}")
    for _ in range(FUZZ_EXAMPLES):
        offset, bit = rng.randrange(size), rng.randrange(8)
        with pytest.raises(InvalidProgramError, match="graph.tosa is not what qlower writes"):
            program_from_bytes(_with_blob(data, "graph.tosa", _flip(offset, bit)), "f.qlp")


def test_truncated_extended_and_swapped_payloads_are_refused():
    tosa, ethos = (program_to_bytes(PROGRAMS[t]) for t in ("tosa-1.0+int", "ethos-u85-256"))
    for data in (_with_blob(tosa, "graph.tosa", lambda b: b[:-16]),
                 _with_blob(tosa, "graph.tosa", lambda b: b + b"\0" * 8),
                 _with_blob(ethos, "graph.tosa", lambda b: PROGRAMS["tosa-1.0+int"].partitions[0].payload
                            .blobs["graph.tosa"] + b"x")):
        with pytest.raises(InvalidProgramError, match="partition 'p0' payload"):
            program_from_bytes(data)


def _crashing_flatbuffer() -> bytes:
    """A flipped byte of a real graph.tosa on which the reference model crashes (SIGSEGV or
    SIGABRT: about 1 in 70 flips); the search is seeded, so it finds the same one every run."""
    blob = PROGRAMS["tosa-1.0+int"].partitions[0].payload.blobs["graph.tosa"]
    rng = random.Random("crash")
    for _ in range(2000):
        candidate = _flip(rng.randrange(len(blob)), rng.randrange(8))(blob)
        try:
            executor.run(candidate, [X])
        except ExecutionError as e:
            if "crashed" in str(e):
                return candidate
    pytest.fail("no flipped byte crashed the reference model in 2000 tries")


def test_a_crash_of_the_reference_model_is_an_execution_error_and_the_caller_goes_on():
    crashing = _crashing_flatbuffer()
    with pytest.raises(ExecutionError, match=r"crashed running .*: its process was killed by SIG(SEGV|ABRT|BUS)"):
        executor.run(crashing, [X], "the crash")
    # the pool replaced the dead worker: later runs work and stay bit-exact
    expected = run_graph(_graph(), [X])[0]
    assert np.array_equal(PROGRAMS["tosa-1.0+int"].run(X)[0], expected)


def test_rejections_of_the_reference_model_name_the_status():
    blob = PROGRAMS["tosa-1.0+int"].partitions[0].payload.blobs["graph.tosa"]
    with pytest.raises(ExecutionError, match="rejected the bad one"):
        executor.run(blob, [X.astype(np.int16)], "the bad one")


@pytest.mark.parametrize("target", sorted(PROGRAMS))
def test_runs_from_many_threads_leave_fd_1_and_2_alone_and_agree(target):
    prog = program_from_bytes(program_to_bytes(PROGRAMS[target]))
    inputs = [np.random.default_rng(i).integers(-128, 128, X.shape, dtype=np.int8) for i in range(4)]
    expected = [run_graph(_graph(), [x])[0] for x in inputs]
    before = [os.fstat(fd) for fd in (1, 2)]
    failures: list[str] = []

    def work(i: int) -> None:
        for _ in range(25):
            if not np.array_equal(prog.run(inputs[i])[0], expected[i]):
                failures.append(f"thread {i}: wrong numbers")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = [os.fstat(fd) for fd in (1, 2)]
    assert failures == []
    assert [(s.st_dev, s.st_ino) for s in after] == [(s.st_dev, s.st_ino) for s in before]


def test_the_worker_pool_is_bounded(monkeypatch):
    monkeypatch.setenv("QLOWER_TOSA_WORKERS", "2")
    pool = executor.new_pool()
    monkeypatch.setattr(executor, "_POOL", pool)
    prog = PROGRAMS["tosa-1.0+int"]
    threads = [threading.Thread(target=lambda: [prog.run(X) for _ in range(5)]) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool._alive == len(pool.pids()) <= 2
    pool.close()
    assert pool._alive == 0 and pool.pids() == []


def test_a_bad_worker_count_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("QLOWER_TOSA_WORKERS", "lots")
    monkeypatch.setattr(executor, "_POOL", executor.new_pool())   # no idle worker to reuse: the limit is read
    with pytest.raises(qlower.errors.QlowerError, match="QLOWER_TOSA_WORKERS='lots'"):
        PROGRAMS["tosa-1.0+int"].run(X)


def _hostile_pad_program() -> Program:
    """828 bytes or so of file that would allocate 2 GiB when run."""
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 1, 1, 1), DType.INT8, Q))
    g = verify_graph(b.build([b.op("pad", x, pads=(0, 0, 0, 1 << 15, 0, 1 << 16, 0, 0), value=3, name="huge")]))
    return Program("reference", g, g)


def test_a_valid_graph_that_would_allocate_gigabytes_is_refused_with_a_limit_to_raise(monkeypatch):
    data = program_to_bytes(_hostile_pad_program())
    assert len(data) < 4096
    size = (1 + (1 << 15)) * (1 + (1 << 16))
    with pytest.raises(InvalidProgramError, match=rf"value %huge .* takes {size:,} bytes, more than the "
                                                  r"1,073,741,824 .* set QLOWER_MAX_TENSOR_BYTES"):
        program_from_bytes(data)
    monkeypatch.setenv("QLOWER_MAX_TENSOR_BYTES", str(1 << 32))   # the user trusts the file
    assert program_from_bytes(data).graph.outputs[0].type.shape == (1, 1 << 15 | 1, 1 << 16 | 1, 1)


@pytest.mark.fuzz
def test_payload_bytes_fuzzed_in_memory_never_kill_the_process():
    """Bypassing load (a payload altered in memory): every run returns or raises ExecutionError,
    and this process (pytest's) survives every one."""
    prog = PROGRAMS["ethos-u85-256"]
    part = prog.partitions[0]
    blob = part.payload.blobs["graph.tosa"]
    rng = random.Random("in-memory")
    outcomes = {"ran": 0, "refused": 0}
    for _ in range(FUZZ_EXAMPLES):
        altered = _flip(rng.randrange(len(blob)), rng.randrange(8))(blob)
        try:
            executor.run(altered, [X])
            outcomes["ran"] += 1
        except ExecutionError:
            outcomes["refused"] += 1
    assert sum(outcomes.values()) == FUZZ_EXAMPLES
