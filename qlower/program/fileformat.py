"""The program file: one file holding a whole compiled Program, safe to load from anyone.

Layout (all integers little-endian)::

    offset  size  field
         0     8  magic  b"\\x89QLOWER\\n"  (non-ASCII first byte and a newline, so a
                  file mangled by a text-mode transfer or a foreign file is caught at once)
         8     4  format version (u32); this qlower writes and reads FORMAT_VERSION
        12     8  body length in bytes (u64)
        20    32  SHA-256 of the body
        52     …  body: a safetensors file

The envelope is checked before anything is parsed: magic, then the version (a
newer file is refused with both version numbers), then length (truncation,
trailing bytes), then the checksum, so accidental corruption is never a silent
wrong result. ``load`` checks the envelope from the first 52 bytes, then reads the
body once, in chunks, into one buffer while hashing it; the tensors are read-only
views of that buffer (a file is never held twice). The body holds every array (constant data, table attributes, and
payload blobs as 1-D uint8 tensors) as safetensors tensors, and the program
header as JSON in its metadata under ``"qlower"``: target, the JSON-able part of
``Program.meta``, an index of the tensors (dtype and shape of each, checked
against the tensor section), the host graph, the source graph (``null`` when it
is the host graph itself), the partitions (name, backend, target, source values,
subgraph, payload: blobs by tensor key, boundary types, tensor map, meta) and the
host decisions (op index in the source graph, its result's name, reason). Graphs
are encoded by ``irjson``.

Loading executes nothing: no pickle, JSON with duplicate keys and non-standard
constants refused, every field type-checked, every graph rebuilt through the op
registry and verified (``qlower.ir.verifier``: also what every target can run),
delegates checked against their partitions, float fallback calls checked against
the forward-pass allow-list, and the program's memory and work estimated from its
shapes and bounded (``qlower.program.limits``) before anything runs. Anything
wrong is an InvalidProgramError naming the file and the place; the checksum
guards against accidents, not against a forger, which the checks behind it are
for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from qlower.contract import Backend, Payload
from qlower.errors import InvalidProgramError, SaveError
from qlower.ir import Graph, TensorType, Value, verify_graph
from qlower.ir.rewrite import AppliedRewrite
from qlower.partition import HostDecision, Partition
from qlower.program.irjson import TensorReader, TensorWriter, dec_type, decode_graph, enc_type, encode_graph
from qlower.program.jsonchecks import as_int, as_list, as_obj, as_str, fail
from qlower.program.limits import MAX_TENSOR_BYTES_ENV, check_program, check_tensor_sizes, max_tensor_bytes  # noqa: F401
from qlower.program.program import Program

MAGIC = b"\x89QLOWER\n"
FORMAT_VERSION = 1
_ENVELOPE = struct.Struct("<8sIQ32s")
_FORMAT_NAME = "qlower-program"
_MAX_NAME = 100
MAX_PROGRAM_BYTES_ENV = "QLOWER_MAX_PROGRAM_BYTES"
DEFAULT_MAX_PROGRAM_BYTES = 2 << 30
_HEADER_FIELDS = ("format", "target", "meta", "tensors", "host", "source", "partitions", "decisions")
# safetensors dtype -> NumPy dtype (little-endian); the only dtypes a program file holds
_ST_DTYPES = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
              "F32": "<f4", "F64": "<f8"}
_SAVABLE = {np.dtype(d).name for d in _ST_DTYPES.values()}
_FOREIGN = {b"PK\x03\x04": "a zip archive (a torch.save or .pt2 file?)", b"\x80": "a Python pickle",
            b"\x89PNG": "a PNG image", b"\x1c\x00\x00\x00TOSA": "a TOSA flatbuffer"}


# -- writing -------------------------------------------------------------------------------

def _json_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``meta`` that JSON can hold (the rest are process-local)."""
    out = {}
    for k, v in meta.items():
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            continue
        if isinstance(k, str):
            out[k] = v
    return out


def name_problem(name: str) -> str | None:
    """Why ``name`` can't name a partition or a payload file (they become ``<partition>/<file>``
    paths of ``Program.artifacts()``, which users write into a folder); None when it can."""
    if not name or len(name) > _MAX_NAME:
        return f"must have 1 to {_MAX_NAME} characters"
    if name in (".", "..") or any(c in name for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "must not be '.' or '..' or hold a path separator or a control character"
    return None


def _enc_partition(p: Partition, tensors: TensorWriter) -> dict:
    pl = p.payload
    for what, name in (("partition name", p.name), *(("payload file name", b) for b in pl.blobs)):
        problem = name_problem(name)
        if problem is not None:
            raise InvalidProgramError(f"can't save partition {p.name[:40]!r}: its {what} {name[:40]!r} {problem}")
    try:
        json.dumps(pl.meta, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidProgramError(f"can't save partition '{p.name}': its Payload.meta is not JSON ({e}); "
                                  "backends must keep only JSON facts there") from None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pl.tensor_map.items()):
        raise InvalidProgramError(f"can't save partition '{p.name}': its tensor_map must map names to names")
    payload = {"backend": pl.backend, "target": pl.target,
               "blobs": {name: tensors.add(bytes(blob)) for name, blob in pl.blobs.items()},
               "input_types": [enc_type(t) for t in pl.input_types],
               "output_types": [enc_type(t) for t in pl.output_types],
               "tensor_map": dict(pl.tensor_map), "meta": pl.meta}
    return {"name": p.name, "backend": p.backend, "target": p.target, "values": list(p.values),
            "subgraph": encode_graph(p.subgraph, tensors), "payload": payload}


def program_to_bytes(program: Program) -> bytes:
    """The program file's bytes. The program's graphs are verified first: an invalid
    program is refused here rather than written and refused at load."""
    graphs: list[Graph] = [program.graph, program.source, *(p.subgraph for p in program.partitions)]
    for g in graphs:
        verify_graph(g, after="compiling (refusing to save an invalid program)")
    tensors = TensorWriter()
    op_index = {op: i for i, op in enumerate(program.source.ops)}
    decisions = []
    for d in program.decisions:
        if d.op not in op_index or not d.op.results:
            raise InvalidProgramError(f"can't save: the host decision '{d.reason}' is about an op "
                                      "that is not in the source graph")
        decisions.append({"op": op_index[d.op], "result": d.op.results[0].name, "reason": d.reason})
    header = {
        "format": _FORMAT_NAME, "target": program.target, "meta": _json_meta(program.meta),
        "host": encode_graph(program.graph, tensors),
        "source": None if program.source is program.graph else encode_graph(program.source, tensors),
        "partitions": [_enc_partition(p, tensors) for p in program.partitions],
        "decisions": decisions,
    }
    header["tensors"] = tensors.index()
    for key, a in tensors.arrays.items():
        if a.dtype.name not in _SAVABLE:
            raise InvalidProgramError(f"can't save: an array of dtype {a.dtype} (tensor {key}); "
                                      f"program files hold {sorted(_SAVABLE)}")
    body = safetensors.numpy.save(tensors.arrays, metadata={
        "qlower": json.dumps(header, allow_nan=False, separators=(",", ":"))})
    return _ENVELOPE.pack(MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).digest()) + body


def save_program(program: Program, path: str | os.PathLike) -> None:
    """Write ``program`` to ``path`` atomically (a reader never sees half a file)."""
    write_atomically(path, program_to_bytes(program))


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, whole.

    The bytes go to a new temporary file beside ``path`` (a random short name, created with
    O_EXCL | O_NOFOLLOW, so a planted file or symlink is never written through; its length
    doesn't grow with the target's name), are flushed to disk, take the old file's permission
    bits, and are renamed over ``path``; then the folder is flushed. Any failure removes the
    temporary file and leaves ``path`` as it was (only a killed process can leave a
    ``.qlower-*.tmp`` behind). Concurrent saves to one path each use their own temporary file:
    the last rename wins, none fails."""
    from qlower.safe_paths import check_destination

    check_destination(path)   # a device, FIFO or symbolic link is never replaced
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise SaveError(f"can't write {os.fspath(path)}: folder {os.fspath(folder) or '.'} does not exist")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise SaveError(f"can't write {os.fspath(path)}: {e.strerror or e}") from None
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".qlower-", suffix=".tmp", dir=folder)   # O_EXCL, mode 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode if mode is not None else 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(folder)
    except OSError as e:
        raise SaveError(f"can't write {os.fspath(path)}: {e.strerror or e} (the file that was there, if any, "
                        "is unchanged)") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, for all threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)   # no /proc: the only way to read it is to set it and put it back
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the OS lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- reading: envelope and body ------------------------------------------------------------

def _envelope_head(head: bytes, total: int) -> tuple[int, int, bytes]:
    """(version, body length, digest) from the first bytes of a file of ``total`` bytes: the
    signature, the version and the length are checked before any of the body is read."""
    if head[:len(MAGIC)] != MAGIC:
        if total < len(MAGIC) and MAGIC.startswith(head):
            raise fail("", f"truncated: only {total} bytes, not even the file signature")
        kind = next((what for prefix, what in _FOREIGN.items() if head.startswith(prefix)), None)
        raise fail("", "not a qlower program file" + (f": it looks like {kind}" if kind else
                                                      f" (it starts with {bytes(head[:8])!r})"))
    if total < _ENVELOPE.size:
        raise fail("", f"truncated: {total} bytes, shorter than the {_ENVELOPE.size}-byte file header")
    _, version, length, digest = _ENVELOPE.unpack_from(head)
    if version > FORMAT_VERSION:
        raise fail("", f"written by a newer qlower (format {version}, this qlower reads up to "
                       f"{FORMAT_VERSION}): upgrade qlower to load it")
    if version < 1:
        raise fail("", f"format version {version} does not exist (corrupt file header)")
    body = total - _ENVELOPE.size
    if body < length:
        raise fail("", f"truncated: the body has {body} of its {length} bytes")
    if body > length:
        raise fail("", f"{body - length} unexpected bytes after the end of the program")
    return version, length, digest


_CHECKSUM_MISMATCH = "checksum mismatch: the file was changed or damaged after it was written"


def _open_envelope(data: bytes | bytearray | memoryview) -> tuple[int, memoryview]:
    """The version and the body (a view: the bytes are not copied) of a whole file's bytes."""
    data = memoryview(data).cast("B")
    version, _, digest = _envelope_head(bytes(data[:_ENVELOPE.size]), len(data))
    body = data[_ENVELOPE.size:]
    if hashlib.sha256(body).digest() != digest:
        raise fail("", _CHECKSUM_MISMATCH)
    return version, body


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise fail("", f"duplicate key {dup[:40]!r} in a JSON object")
    return d


def _no_constants(name: str) -> Any:
    raise fail("", f"non-standard JSON constant {name}")


def _strict_json(raw: bytes | str, where: str) -> Any:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except InvalidProgramError as e:
        raise fail(where, str(e)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise fail(where, f"is not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


def _to_array(name: str, code: Any, shape: Any, data: memoryview) -> np.ndarray:
    """A read-only array over ``data`` (no copy)."""
    where = f"tensor '{name[:40]}'"
    dtype = _ST_DTYPES.get(code) if type(code) is str else None
    if dtype is None:
        raise fail(where, f"has dtype {str(code)[:20]!r}; program files hold only {sorted(_ST_DTYPES)}")
    shape = tuple(as_int(d, f"{where} shape", 0) for d in as_list(shape, f"{where} shape"))
    if len(data) != math.prod(shape) * np.dtype(dtype).itemsize:
        raise fail(where, f"has {len(data)} bytes for {code}{list(shape)}")
    array = np.frombuffer(data, dtype=np.dtype(dtype))
    if array.dtype == np.bool_ and np.frombuffer(data, np.uint8).max(initial=0) > 1:
        raise fail(where, "is a boolean tensor holding bytes other than 0 and 1")
    array = array.reshape(shape)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    array.setflags(write=False)
    return array


def _open_body(body: bytes | memoryview) -> tuple[Any, dict[str, np.ndarray]]:
    """The program header (decoded JSON, unchecked) and the tensors of the safetensors body, as
    read-only arrays over ``body`` (nothing is copied: a loaded file is held once). The tensor
    section is checked as strictly as the safetensors format asks: every tensor's dtype, shape and
    byte range, the ranges in order, back to back, covering the data exactly."""
    body = memoryview(body).cast("B")
    if len(body) < 8:
        raise fail("tensor section", f"truncated ({len(body)} bytes)")
    n = int.from_bytes(body[:8], "little")
    if n > len(body) - 8:
        raise fail("tensor section", f"its header claims {n} bytes, only {len(body) - 8} follow")
    st_header = as_obj(_strict_json(bytes(body[8:8 + n]), "tensor section header"), "tensor section header")
    meta = st_header.get("__metadata__")
    if type(meta) is not dict or "qlower" not in meta or not all(type(v) is str for v in meta.values()):
        raise fail("tensor section", "has no qlower program header in its metadata")
    header = _strict_json(as_str(meta["qlower"], "program header"), "program header")
    data = body[8 + n:]
    entries = []
    for name, info in st_header.items():
        if name == "__metadata__":
            continue
        where = f"tensor '{name[:40]}'"
        info = as_obj(info, where, ("dtype", "shape", "data_offsets"))
        offsets = as_list(info["data_offsets"], f"{where} data_offsets")
        if len(offsets) != 2:
            raise fail(where, "data_offsets must be [start, end]")
        start, end = (as_int(o, f"{where} data_offsets", 0, len(data)) for o in offsets)
        if end < start:
            raise fail(where, f"ends ({end}) before it starts ({start})")
        entries.append((start, end, name, info))
    entries.sort(key=lambda e: (e[0], e[1]))
    at = 0
    for start, end, name, _ in entries:
        if start != at:
            raise fail("tensor section", f"tensor '{name[:40]}' starts at byte {start}, not {at} where the "
                                         "one before it ends (overlapping or gapped data)")
        at = end
    if at != len(data):
        raise fail("tensor section", f"its tensors cover {at} of its {len(data)} data bytes")
    return header, {name: _to_array(name, info["dtype"], info["shape"], data[start:end])
                    for start, end, name, info in entries}


def _check_tensor_index(index: Any, arrays: dict[str, np.ndarray]) -> None:
    index = as_obj(index, "tensor index")
    if set(index) != set(arrays):
        only_header, only_data = sorted(set(index) - set(arrays)), sorted(set(arrays) - set(index))
        raise fail("tensor index", f"lists tensors {only_header[:5]} the file lacks, "
                                   f"the file has tensors {only_data[:5]} it doesn't list")
    for key, entry in index.items():
        where = f"tensor index entry '{key}'"
        entry = as_obj(entry, where, ("dtype", "shape"))
        shape = [as_int(s, where, 0) for s in as_list(entry["shape"], where)]
        a = arrays[key]
        if as_str(entry["dtype"], where) != a.dtype.name or tuple(shape) != a.shape:
            raise fail(f"tensor '{key}'", f"is {a.dtype.name}{list(a.shape)} in the tensor section, "
                                          f"but the header says {entry['dtype']}{shape}")


# -- reading: the program ------------------------------------------------------------------

def _dec_payload(x: Any, tensors: TensorReader, where: str) -> Payload:
    d = as_obj(x, where, ("backend", "target", "blobs", "input_types", "output_types", "tensor_map", "meta"))
    blobs = {}
    for name, key in as_obj(d["blobs"], f"{where} blobs").items():
        if name_problem(name) is not None:
            raise fail(f"{where} blobs", f"the file name {name[:40]!r} {name_problem(name)}")
        a = tensors.get(key, f"{where} blob '{name[:40]}'")
        if a.dtype != np.uint8 or a.ndim != 1:
            raise fail(f"{where} blob '{name[:40]}'", f"must be a 1-D uint8 tensor, got {a.dtype}{list(a.shape)}")
        blobs[name] = a.tobytes()
    tmap = {k: as_str(v, f"{where} tensor_map") for k, v in as_obj(d["tensor_map"], f"{where} tensor_map").items()}
    return Payload(as_str(d["backend"], f"{where} backend"), as_str(d["target"], f"{where} target"), blobs,
                   tuple(dec_type(t, f"{where} input type") for t in as_list(d["input_types"], where)),
                   tuple(dec_type(t, f"{where} output type") for t in as_list(d["output_types"], where)),
                   tmap, as_obj(d["meta"], f"{where} meta"))


def _payload_backend(payload: Payload, where: str) -> Backend:
    """The registered backend that runs ``payload``: its target must be a partitioning target
    and its backend name that target's backend."""
    from qlower.backends.registry import HOST_TARGETS, backend_for, targets

    if payload.target not in targets() or payload.target in HOST_TARGETS:
        raise fail(f"{where} payload", f"targets {payload.target[:40]!r}, which no partitioning backend "
                                       f"compiles for (targets with partitions: "
                                       f"{', '.join(t for t in targets() if t not in HOST_TARGETS)})")
    backend = backend_for(payload.target)
    if backend.name != payload.backend:
        raise fail(f"{where} payload", f"names backend {payload.backend[:40]!r}, but target "
                                       f"{payload.target!r} is compiled by {backend.name!r}")
    return backend


def _dec_partition(x: Any, tensors: TensorReader, source_names: set[str], where: str) -> Partition:
    d = as_obj(x, where, ("name", "backend", "target", "values", "subgraph", "payload"))
    name = as_str(d["name"], f"{where} name")
    if name_problem(name) is not None:
        raise fail(f"{where} name", f"{name[:40]!r} {name_problem(name)}")
    where = f"partition '{name[:40]}'"
    sub = decode_graph(d["subgraph"], tensors, f"{where} subgraph")
    check_program([(f"{where} subgraph", sub)])   # before its backend compiles it again (check_loaded)
    payload = _dec_payload(d["payload"], tensors, f"{where} payload")
    if (len(payload.input_types), len(payload.output_types)) != (len(sub.inputs), len(sub.outputs)):
        raise fail(where, f"its payload has {len(payload.input_types)} inputs and {len(payload.output_types)} "
                          f"outputs, its subgraph {len(sub.inputs)} and {len(sub.outputs)}")
    # the payload's bytes reach native code: only what its backend vouches for (see Backend.check_loaded)
    if (d["backend"], d["target"]) != (payload.backend, payload.target):
        raise fail(where, f"is for backend {str(d['backend'])[:40]!r} and target {str(d['target'])[:40]!r}, its "
                          f"payload for {payload.backend[:40]!r} and {payload.target[:40]!r}")
    backend = _payload_backend(payload, where)
    problem = payload.check() or backend.check_meta(payload) or backend.check_loaded(sub, payload)
    if problem is not None:
        raise fail(f"{where} payload", problem)
    values = tuple(as_str(v, f"{where} values") for v in as_list(d["values"], f"{where} values"))
    unknown = [v for v in values if v not in source_names]
    if unknown:
        raise fail(where, f"computes values {unknown[:5]} that the source graph doesn't have")
    return Partition(name, as_str(d["backend"], f"{where} backend"), as_str(d["target"], f"{where} target"),
                     sub, payload, values)


def _check_delegates(host: Graph, partitions: list[Partition]) -> None:
    by_name = {p.name: p for p in partitions}
    if len(by_name) != len(partitions):
        raise fail("partitions", "two partitions have the same name")
    for op in host.ops:
        if op.kind != "delegate":
            continue
        where = f"host graph delegate %{op.results[0].name if op.results else '?'}"
        part = by_name.get(op.attrs["partition"])
        if part is None:
            raise fail(where, f"calls partition '{op.attrs['partition'][:40]}', which the file doesn't contain")
        if tuple(op.attrs["in_types"]) != part.input_types or tuple(op.attrs["out_types"]) != part.output_types:
            raise fail(where, f"its boundary types differ from partition '{part.name}''s payload types")


def _check_source_inputs(inputs: tuple[Value, ...], source: Graph) -> None:
    """The host graph's inputs are the source graph's (the partitioner copies them): ``Program.run``
    checks integer codes against the host graph's types, so they may not be wider than the source
    graph, the program's form that was compiled and verified."""
    if len(inputs) != len(source.inputs):
        raise fail("host graph", f"takes {len(inputs)} input(s), its source graph {len(source.inputs)}")
    for i, (v, s) in enumerate(zip(inputs, source.inputs)):
        if v.type != s.type:
            raise fail(f"host graph input #{i} %{v.name[:40]}", f"is declared {_with_range(v.type)}, but the source "
                                                               f"graph (the program as compiled and verified) reads "
                                                               f"{_with_range(s.type)}")


def _check_partition_inputs(host: Graph, partitions: list[Partition]) -> None:
    """A graph input that a delegate reads as it is has the type its partition's subgraph was lowered
    and verified for (the partitioner converts explicitly where they differ): a backend whose payload
    declares no range of its own (a .tflite's tensors hold scale and zero point only) would otherwise
    run codes outside that range under a widened declaration."""
    index = {v: i for i, v in enumerate(host.inputs)}
    by_name = {p.name: p for p in partitions}
    for op in host.ops:
        if op.kind != "delegate":
            continue
        part = by_name[op.attrs["partition"]]
        for j, (v, s) in enumerate(zip(op.input_values(), part.subgraph.inputs)):
            if v in index and v.type != s.type:
                raise fail(f"host graph input #{index[v]} %{v.name[:40]}",
                           f"is declared {_with_range(v.type)}, but partition '{part.name}' reads it as its input "
                           f"#{j}, lowered and verified for {_with_range(s.type)}")


def _with_range(t: TensorType) -> str:
    """``t`` with its codes' range spelled out (a type prints it only when narrower than its dtype)."""
    q = t.quant
    return f"{t} (codes [{q.qmin}, {q.qmax}])" if q is not None and (q.qmin, q.qmax) == (t.dtype.min, t.dtype.max) \
        else str(t)


def _dec_decision(x: Any, source: Graph, where: str) -> HostDecision:
    d = as_obj(x, where, ("op", "result", "reason"))
    i = as_int(d["op"], f"{where} op", 0, len(source.ops) - 1)
    op, name = source.ops[i], as_str(d["result"], f"{where} result")
    actual = op.results[0].name if op.results else None
    if actual != name:
        raise fail(where, f"names %{name[:40]}, but op #{i} of the source graph produces %{actual}")
    return HostDecision(op, as_str(d["reason"], f"{where} reason"))


def _dec_meta(x: Any) -> dict[str, Any]:
    meta = as_obj(x, "program meta")
    from qlower.backends.threads import MAX_THREADS_ENV, max_threads

    threads, limit = meta.get("threads"), max_threads()   # the bound a run applies: a file loads only if it runs
    if threads is not None and (type(threads) is not int or not 1 <= threads <= limit):
        raise fail("program meta", f"threads must be null or an integer in [1, {limit}] (set {MAX_THREADS_ENV} to "
                                   f"allow more), got {str(threads)[:40]}")
    for i, record in enumerate(as_list(meta.get("rewrites", []), "program meta rewrites")):
        try:
            AppliedRewrite.from_meta(record)
        except ValueError as e:
            raise fail(f"program meta rewrite #{i}", str(e)) from None
    return meta


def _decode_program(header: Any, arrays: dict[str, np.ndarray]) -> Program:
    h = as_obj(header, "program header", _HEADER_FIELDS)
    if h["format"] != _FORMAT_NAME:
        raise fail("program header", f"format is {str(h['format'])[:40]!r}, not {_FORMAT_NAME!r}")
    _check_tensor_index(h["tensors"], arrays)
    tensors = TensorReader(arrays)
    source = None if h["source"] is None else decode_graph(h["source"], tensors, "source graph")
    host = decode_graph(h["host"], tensors, "host graph",
                        None if source is None else lambda inputs: _check_source_inputs(inputs, source))
    source = host if source is None else source
    check_tensor_sizes(source, "source graph")
    check_program([("host graph", host)])
    names = {v.name for v in source.values()}
    partitions = [_dec_partition(p, tensors, names, f"partition #{i}")
                  for i, p in enumerate(as_list(h["partitions"], "partitions"))]
    _check_delegates(host, partitions)
    _check_partition_inputs(host, partitions)
    check_program([("host graph", host), *((f"partition '{p.name}'", p.subgraph) for p in partitions)])
    decisions = [_dec_decision(d, source, f"host decision #{i}")
                 for i, d in enumerate(as_list(h["decisions"], "host decisions"))]
    unused = sorted(set(arrays) - tensors.used)
    if unused:
        raise fail("tensor section", f"holds tensors {unused[:5]} that nothing refers to")
    return Program(_dec_target(h["target"], partitions), host, source, partitions, decisions, _dec_meta(h["meta"]))


def _dec_target(x: Any, partitions: list[Partition]) -> str:
    """The program's target: one qlower knows, the one every partition was lowered for (it names the
    program in ``explain``, reports and exports; a forged name would load and be shown)."""
    from qlower.backends.registry import targets

    target = as_str(x, "target")
    if target not in targets():
        raise fail("program header", f"target {target[:40]!r} is not one of qlower's targets")
    other = next((p for p in partitions if p.target != target), None)
    if other is not None:
        raise fail("program header", f"target {target!r}, but partition '{other.name}' was lowered for "
                                     f"{other.target[:40]!r}")
    return target


def max_program_bytes() -> int:
    """The largest program file ``load`` reads (env QLOWER_MAX_PROGRAM_BYTES, default 2 GiB)."""
    raw = os.environ.get(MAX_PROGRAM_BYTES_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_PROGRAM_BYTES


_CHUNK = 1 << 24


def _read(path: str | os.PathLike) -> tuple[int, bytearray, int]:
    """(format version, body, file size) of a program file, the body's checksum verified while it
    is read: only a regular file no larger than the limit is read (a FIFO or a device would block
    or never end, a huge file would fill the memory), its envelope is checked from the first bytes,
    and the body is read once, in chunks, into one buffer (the file is never held twice)."""
    name = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InvalidProgramError(f"can't read program file {name}: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise InvalidProgramError(f"can't read program file {name}: it is {kind}, not a program file")
    with os.fdopen(fd, "rb", buffering=0) as f:
        limit = max_program_bytes()
        if st.st_size > limit:
            raise InvalidProgramError(f"{name}: {st.st_size:,} bytes, more than the {limit:,} a program file may "
                                      f"have; set {MAX_PROGRAM_BYTES_ENV} to raise the limit if the file is trusted")
        try:
            head = _read_exactly(f, min(_ENVELOPE.size, st.st_size))
            try:
                version, length, digest = _envelope_head(head, st.st_size)
            except InvalidProgramError as e:
                raise InvalidProgramError(f"{name}: {e}") from None
            body = bytearray(length)
            view, sha, at = memoryview(body), hashlib.sha256(), 0
            while at < length:
                got = f.readinto(view[at:at + _CHUNK])
                if not got:
                    raise InvalidProgramError(f"{name}: the file shrank while it was read")
                sha.update(view[at:at + got])
                at += got
            if f.read(1):   # one more: a file that grows while read is caught
                raise InvalidProgramError(f"{name}: the file grew while it was read")
        except OSError as e:
            raise InvalidProgramError(f"can't read program file {name}: {e.strerror or e}") from None
    if sha.digest() != digest:
        raise InvalidProgramError(f"{name}: {_CHECKSUM_MISMATCH}")
    return version, body, st.st_size


def _read_exactly(f: Any, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def program_from_bytes(data: bytes, name: str = "program") -> Program:
    """Decode a program file's bytes (see the module docstring for what is checked)."""
    try:
        version, body = _open_envelope(data)
    except InvalidProgramError as e:
        raise InvalidProgramError(f"{name}: {e}") from None
    return _parse_body(body, name)


def _parse_body(body: bytes | bytearray | memoryview, name: str) -> Program:
    try:
        header, arrays = _open_body(body)
        return _decode_program(header, arrays)
    except InvalidProgramError as e:
        raise InvalidProgramError(f"{name}: {e}") from None


def load(path: str | os.PathLike) -> Program:
    """Load a program saved with ``Program.save``; exposed as ``qlower.load``."""
    _, body, _ = _read(path)
    return _parse_body(body, os.fspath(path))


def inspect_program(path: str | os.PathLike) -> dict[str, Any]:
    """What a program file holds, without running it (for ``qlower inspect``). The file is
    fully checked, as by ``load``."""
    version, body, size = _read(path)
    prog = _parse_body(body, os.fspath(path))

    def op_counts(g: Graph) -> dict[str, int]:
        return dict(sorted(g.count_ops().items()))

    return {
        "file": os.fspath(path), "file_size": size, "format_version": version,
        "target": prog.target, "targets": sorted({prog.target, *(p.target for p in prog.partitions)}),
        "inputs": [f"%{v.name}: {v.type}" for v in prog.graph.inputs],
        "outputs": [f"%{v.name}: {v.type}" for v in prog.graph.outputs],
        "host_ops": op_counts(prog.graph),
        "host_decisions": [{"value": d.op.results[0].name, "kind": d.op.kind, "reason": d.reason}
                           for d in prog.decisions],
        "partitions": [{"name": p.name, "backend": p.backend, "target": p.target,
                        "ops": op_counts(p.subgraph),
                        "inputs": [str(t) for t in p.input_types], "outputs": [str(t) for t in p.output_types],
                        "blobs": {k: len(b) for k, b in p.payload.blobs.items()},
                        "bytes": sum(len(b) for b in p.payload.blobs.values()), "meta": p.payload.meta}
                       for p in prog.partitions],
        "source_ops": op_counts(prog.source),
        "meta": prog.meta,
    }
