"""Saving never writes through a planted link, keeps the old file intact on every failure and
its permissions on success; loading refuses huge, endless and special files before reading them,
and names that would escape a folder, missing blobs and host targets in partitions."""

import hashlib
import json
import os
import stat
import struct
import tempfile
import threading
import time

import numpy as np
import pytest
import safetensors.numpy

import qlower
from qlower.errors import InvalidProgramError, QlowerError, SaveError
from qlower.ir import DType, GraphBuilder, QuantSpec, TensorType, verify_graph
from qlower.program import Program, fileformat
from qlower.program.fileformat import program_from_bytes, program_to_bytes

HEAD = struct.Struct("<8sIQ32s")


def _graph():
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4, 4, 2), DType.INT8, QuantSpec.per_tensor(0.1, 1)))
    y = b.op("max_pool2d", x, kernel=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0), name="y")
    return verify_graph(b.build([y]))


def _program(target="reference") -> Program:
    from qlower.api import lower_graph

    return lower_graph(_graph(), target)


PROG = _program()
TOSA = _program("tosa-1.0+int")


# -- saving ---------------------------------------------------------------------------------

def test_a_planted_symlink_at_the_temp_name_is_not_followed(tmp_path, monkeypatch):
    """The temporary name is random; even when an attacker guesses it (here: the name source is
    made predictable), O_EXCL|O_NOFOLLOW refuses to open through the planted link."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    names = iter(["planted"] * 100 + ["fresh"] * 100)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    (tmp_path / ".qlower-planted.tmp").symlink_to(victim)
    PROG.save(tmp_path / "prog.qlp")
    assert victim.read_text() == "precious"
    assert qlower.load(tmp_path / "prog.qlp").target == "reference"
    assert os.path.islink(tmp_path / ".qlower-planted.tmp")          # the planted link, untouched


def test_permissions_of_an_existing_file_are_kept(tmp_path):
    path = tmp_path / "p.qlp"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    PROG.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    fresh = tmp_path / "fresh.qlp"
    PROG.save(fresh)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("failing", ["fsync", "replace", "write"])
def test_a_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, failing):
    path = tmp_path / "p.qlp"
    path.write_bytes(b"the old program")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")
    if failing == "write":
        monkeypatch.setattr(fileformat, "program_to_bytes", lambda p: b"x" * 10)
        monkeypatch.setattr(os, "fdopen", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    else:
        monkeypatch.setattr(os, failing, boom)
    with pytest.raises(SaveError, match=f"can't write {path}: No space left"):
        PROG.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == b"the old program"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.qlp"]


def test_an_interrupted_save_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "p.qlp"
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        PROG.save(path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_threads_saving_to_one_path_all_succeed(tmp_path):
    path = tmp_path / "p.qlp"
    errors = []

    def work():
        for _ in range(20):
            try:
                PROG.save(path)
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert qlower.load(path).target == "reference"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.qlp"]


def test_a_long_valid_file_name_saves(tmp_path):
    path = tmp_path / ("p" * 247 + ".qlp")      # 251 characters: the longest name most file systems allow
    PROG.save(path)
    assert qlower.load(path).target == "reference"


def test_saving_into_a_missing_folder_names_the_folder(tmp_path):
    with pytest.raises(SaveError, match=f"folder {tmp_path / 'nope'} does not exist"):
        PROG.save(tmp_path / "nope" / "p.qlp")
    with pytest.raises(SaveError, match="folder .* does not exist"):
        TOSA.export(tmp_path / "nope" / "m.tflite")


# -- loading: sizes and special files ---------------------------------------------------------

def test_a_file_claiming_3_gib_is_refused_without_reading_it(tmp_path, monkeypatch):
    path = tmp_path / "huge.qlp"
    with open(path, "wb") as f:
        f.write(HEAD.pack(b"\x89QLOWER\n", 1, 3 << 30, b"\0" * 32))
        f.truncate(3 << 30)          # a sparse 3 GiB file: no disk used
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    start = time.perf_counter()
    with pytest.raises(InvalidProgramError, match=r"3,221,225,472 bytes, more than the 2,147,483,648 .* "
                                                  "set QLOWER_MAX_PROGRAM_BYTES"):
        qlower.load(path)
    assert time.perf_counter() - start < 1.0 and sum(reads) < 1 << 20
    monkeypatch.setenv("QLOWER_MAX_PROGRAM_BYTES", "100")
    PROG.save(tmp_path / "small.qlp")
    with pytest.raises(InvalidProgramError, match="more than the 100 a program file may have"):
        qlower.load(tmp_path / "small.qlp")


def test_dev_zero_a_fifo_and_a_folder_are_refused_without_blocking(tmp_path):
    with pytest.raises(InvalidProgramError, match="it is a device, not a program file"):
        qlower.load("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)       # no writer: a blocking open or read would hang this test
    with pytest.raises(InvalidProgramError, match="it is a FIFO, not a program file"):
        qlower.load(fifo)
    with pytest.raises(InvalidProgramError, match="it is a folder"):
        qlower.load(tmp_path)


# -- loading: names, blobs, targets -----------------------------------------------------------

def _edit(data: bytes, change) -> bytes:
    body = data[HEAD.size:]
    n = int.from_bytes(body[:8], "little")
    header = json.loads(json.loads(body[8:8 + n])["__metadata__"]["qlower"])
    arrays = dict(safetensors.numpy.load(body))
    change(header)
    body = safetensors.numpy.save(arrays, metadata={"qlower": json.dumps(header)})
    return HEAD.pack(b"\x89QLOWER\n", 1, len(body), hashlib.sha256(body).digest()) + body


def _rename_blob(new: str):
    def change(h):
        blobs = h["partitions"][0]["payload"]["blobs"]
        blobs[new] = blobs.pop("graph.tosa")
    return change


def _rename_partition(new: str):
    def change(h):
        old = h["partitions"][0]["name"]
        h["partitions"][0]["name"] = new
        for op in h["host"]["ops"]:
            if op["kind"] == "delegate" and op["attrs"]["partition"] == old:
                op["attrs"]["partition"] = new
    return change


@pytest.mark.parametrize("bad", ["../../etc/passwd", "a/b", "..", "x\\y", "evil\x1b[2J", "", "n" * 101, "nul\0"])
def test_names_that_would_escape_a_folder_are_refused(bad):
    data = program_to_bytes(TOSA)
    with pytest.raises(InvalidProgramError, match="blobs: the file name"):
        program_from_bytes(_edit(data, _rename_blob(bad)))
    with pytest.raises(InvalidProgramError, match="name: .* must"):
        program_from_bytes(_edit(data, _rename_partition(bad)))


def test_names_that_would_escape_a_folder_are_not_saved():
    part = TOSA.partitions[0]
    evil = type(part.payload)(part.payload.backend, part.payload.target, {"../x": b"", **part.payload.blobs},
                              part.payload.input_types, part.payload.output_types, part.payload.tensor_map,
                              part.payload.meta)
    prog = Program(TOSA.target, TOSA.graph, TOSA.source,
                   [type(part)(part.name, part.backend, part.target, part.subgraph, evil, part.values)],
                   TOSA.decisions, TOSA.meta)
    with pytest.raises(InvalidProgramError, match="payload file name '../x' must not"):
        program_to_bytes(prog)


def test_artifacts_stay_inside_their_folder():
    for key in TOSA.artifacts():
        assert os.path.normpath(os.path.join("out", key)).startswith("out" + os.sep)


def test_a_missing_blob_is_refused_at_load():
    def drop(h):
        h["partitions"][0]["payload"]["blobs"].pop("graph.tosa")
    with pytest.raises(InvalidProgramError, match="partition 'p0' payload: the payload has no graph.tosa"):
        program_from_bytes(_edit(program_to_bytes(TOSA), drop))


@pytest.mark.parametrize("target", ["cpu", "reference", "nonsense"])
def test_a_partition_for_a_host_or_unknown_target_is_refused_at_load(target):
    def retarget(h):
        h["partitions"][0]["target"] = target
        h["partitions"][0]["payload"]["target"] = target
    with pytest.raises(InvalidProgramError, match=f"targets '{target}', which no partitioning backend compiles for"):
        program_from_bytes(_edit(program_to_bytes(TOSA), retarget))


def test_a_partition_whose_backend_disagrees_with_its_payload_is_refused():
    def rebrand(h):
        h["partitions"][0]["payload"]["backend"] = "ethos-u"
    with pytest.raises(InvalidProgramError, match="is for backend 'tosa' .* its payload for 'ethos-u'"):
        program_from_bytes(_edit(program_to_bytes(TOSA), rebrand))


def test_every_failure_is_a_qlower_error_and_saved_programs_round_trip(tmp_path):
    path = tmp_path / "t.qlp"
    TOSA.save(path)
    loaded = qlower.load(path)
    x = np.arange(32, dtype=np.int8).reshape(1, 4, 4, 2)
    assert np.array_equal(loaded.run(x)[0], PROG.run(x)[0])
    assert issubclass(SaveError, QlowerError) and issubclass(SaveError, OSError)


@pytest.mark.parametrize("key,value,message", [
    ("execution", "teleported: somewhere", "execution kind 'teleported' is not one of the kinds backend 'tosa' declares"),
    ("execution", "tele ported: somewhere", "execution kind 'tele ported' is not a word"),
    ("execution", 7, "execution must be a string"),
    ("output_tensors", [], "the TOSA graph names 1 inputs and 0 outputs"),
    ("input_tensors", [3], "TOSA input_tensors must be a list of names"),
])
def test_the_typed_facts_of_a_payload_are_checked_at_load(key, value, message):
    """What behaviour depends on (how the payload runs, which tensors are its boundary) is read
    through Payload's typed views; a file whose metadata can't be read that way is refused."""
    def alter(h):
        h["partitions"][0]["payload"]["meta"][key] = value
    with pytest.raises(InvalidProgramError, match=f"partition 'p0' payload: {message}"):
        program_from_bytes(_edit(program_to_bytes(TOSA), alter))
