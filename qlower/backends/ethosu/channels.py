"""Wider channels where Vela runs a convolution faster: zero channels that change no number.

Vela's U85 estimate of a convolution grows with its input depth in steps, and not
monotonically: a 1x1 convolution reading 17-32 channels costs twice one reading 33-64
(measured, 56x56 to 96 channels: 151,488 cycles for 24 or 32 input channels, 76,064 for 48).
MobileNetV2's 24- and 32-channel bottlenecks hit that step five times.

A *run* here is a set of NHWC tensors of one depth tied together by per-element ops (rescale,
add, clamp), written by convolutions and read by convolutions (or those per-element ops)
only. Padding a run to more channels gives each writing convolution zero weights and a zero
bias for the new channels, whose codes are then the zero point (0.0); the per-element ops keep
0.0 at 0.0; each reading convolution gets zero weights for them. So every original channel of
every tensor keeps its exact codes: this is a layout choice of the NPU partition, not a change
of the program's meaning. The program's source, traced values (sliced back, see
``unpad_traced``) and the reference never see the extra channels.

Whether a run pays depends on the accelerator and memory system (the writers do more work,
the readers less), so each candidate is decided by Vela: the run's convolutions are compiled
alone, both ways, and the padding is kept when its total cycles are lower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qlower.ir import Graph, GraphBuilder, Op, Value, copy_ops, rebuild
from qlower.ir.rewrite import Rewrite, Rewritten

ELEMENTWISE = ("rescale", "add", "clamp")   # ops that map a zero-point channel to a zero-point channel
MAX_GROWTH = 4                              # a width beyond this many times a run's is refused


@dataclass(frozen=True)
class Run:
    """Tensors of ``channels`` channels tied by per-element ops, written and read by convolutions."""

    values: frozenset[Value]
    writers: tuple[Op, ...]      # conv2d ops whose result is in the run
    readers: tuple[Op, ...]      # conv2d ops whose input is in the run
    channels: int

    @property
    def name(self) -> str:
        """The run's key in a payload: its first writer's result."""
        return self.writers[0].result.name


def _plain_conv(op: Op, producers: dict[Value, Op], users: dict[Value, list[Op]]) -> bool:
    """A conv2d without groups whose weight (and bias) are constants of its own, its weights
    symmetric: its channels can be widened by padding them (a zero weight code is 0.0 only at
    weight zero point 0; else a padded channel would write, or read, something)."""
    if op.kind != "conv2d" or op.attrs["groups"] != 1:
        return False
    w = op.operands[1].type.quant
    if w is None or any(z != 0 for z in w.zero_point):
        return False
    consts = [v for v in op.operands[1:] if v is not None]
    return all(producers.get(v) is not None and producers[v].kind == "constant" and users.get(v) == [op]
               for v in consts)


def runs(graph: Graph) -> list[Run]:
    """Every run of ``graph`` (see the module docstring) with at least one reader."""
    producers, users = graph.producers(), graph.users()
    parent: dict[Value, Value] = {}

    def find(v: Value) -> Value:
        while parent.get(v, v) is not v:
            v = parent[v]
        return v

    def union(a: Value, b: Value) -> None:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        parent[find(a)] = find(b)

    for op in graph.ops:
        if _plain_conv(op, producers, users) and op.result.type.rank == 4:
            parent.setdefault(op.result, op.result)
        elif op.kind in ELEMENTWISE:
            for v in op.operands:
                if v is not None:
                    union(v, op.result)
    groups: dict[Value, set[Value]] = {}
    for v in parent:
        groups.setdefault(find(v), set()).add(v)
    outputs, inputs = set(graph.outputs), set(graph.inputs)
    order = {op: i for i, op in enumerate(graph.ops)}   # a run is named after its first writer
    found = []
    for values in groups.values():
        run = _checked(values, producers, users, outputs, inputs, order)
        if run is not None:
            found.append(run)
    return sorted(found, key=lambda r: r.name)


def _checked(values: set[Value], producers, users, outputs, inputs, order: dict[Op, int]) -> Run | None:
    """The run of ``values``, or None when any of its tensors is read or written otherwise."""
    shapes = {v.type.shape for v in values}
    if len(shapes) != 1 or len(next(iter(shapes))) != 4 or values & (outputs | inputs):
        return None
    channels = next(iter(shapes))[3]
    writers, readers = [], []
    for v in values:
        p = producers.get(v)
        if p is None:
            return None
        if p.kind == "conv2d":
            if not _plain_conv(p, producers, users):
                return None
            writers.append(p)
        elif p.kind not in ELEMENTWISE or not _keeps_zero(p):
            return None
        for u in users.get(v, []):
            if u.kind == "conv2d" and u.operands[0] is v and _plain_conv(u, producers, users):
                readers.append(u)
            elif u.kind not in ELEMENTWISE or u.result not in values:
                return None
    if not writers or not readers:
        return None
    return Run(frozenset(values), tuple(sorted(set(writers), key=order.get)), tuple(sorted(set(readers), key=order.get)),
               channels)


def _keeps_zero(op: Op) -> bool:
    """Whether ``op`` maps 0.0 to 0.0 channel by channel: per-tensor quantization throughout (a
    per-channel output would need parameters for the new channels) and no constant operand."""
    if any(v is None or v.type.quant is None for v in op.operands):
        return False
    if op.kind == "rescale" and op.attrs["out"].is_per_channel:
        return False
    if op.kind == "clamp":   # a clamp whose range leaves out the zero point moves 0.0
        return op.attrs["min"] <= op.operands[0].type.quant.zero_point[0] <= op.attrs["max"]
    return all(v.type.shape == op.result.type.shape for v in op.operands)


def candidate_width(channels: int) -> int | None:
    """The one wider depth tried for a run: 8 past the power of two at or above its own (where
    Vela's input-depth steps fall), or None when that would more than half as much again."""
    power = max(16, 1 << (channels - 1).bit_length())
    width = power + 8
    return width if width <= channels * 3 // 2 + 8 else None


def _alone(graph: Graph, run: Run) -> Graph:
    """The run's convolutions and per-element ops, with the rescale each reader's accumulator
    feeds, as a graph of their own (what Vela is asked to cost)."""
    users = graph.users()
    ops = set(run.writers) | set(run.readers)
    ops |= {graph.producers()[v] for v in run.values}
    for r in run.readers:
        ops |= {u for u in users.get(r.result, []) if u.kind == "rescale"}
    ordered = [op for op in graph.ops if op in ops]
    inside = {v for op in ordered for v in op.input_values()}
    leaving = {v for op in ordered for v in op.results if v not in inside}
    return copy_ops(graph, ordered, f"{run.name}/alone", leaving)[0]


def cheaper_widths(graph: Graph, total_cycles: Callable[[Graph], int | None]) -> dict[str, int]:
    """``Run.name`` -> width for every run whose candidate width Vela costs lower than its own
    (``total_cycles`` compiles a graph and returns Vela's total, or None when it can't)."""
    chosen = {}
    for run in runs(graph):
        width = candidate_width(run.channels)
        if width is None:
            continue
        alone = _alone(graph, run)
        before = total_cycles(alone)
        after = total_cycles(widen(alone, {run.name: width})) if before is not None else None
        if after is not None and after < before:
            chosen[run.name] = width
    return chosen


def widen(graph: Graph, widths: dict[str, int]) -> Graph:
    """``graph`` with each run named in ``widths`` (``Run.name`` -> channels) padded to that many
    channels: only the convolutions' weight and bias constants change (zeros appended, same names);
    every other op is re-emitted and re-typed. ValueError for a name that is no run, or a width
    narrower than the run or more than MAX_GROWTH times it (a loaded program's widths are input)."""
    by_name = {r.name: r for r in runs(graph)}
    out_width: dict[Op, int] = {}   # conv -> channels it writes
    in_width: dict[Op, int] = {}    # conv -> channels it reads
    for name, width in widths.items():
        run = by_name.get(name)
        if run is None:
            raise ValueError(f"%{str(name)[:60]} names no run of convolutions")
        if not isinstance(width, int) or not run.channels <= width <= MAX_GROWTH * run.channels:
            raise ValueError(f"run %{name} of {run.channels} channels can't be {str(width)[:20]} wide")
        out_width.update((w, width) for w in run.writers)
        in_width.update((r, width) for r in run.readers)
    if not out_width:
        return graph
    producers = graph.producers()
    padded: dict[Value, np.ndarray] = {}   # weight / bias constant -> its padded data
    per_channel_bias: set[Value] = set()     # biases of convolutions with per-channel weights
    for conv in {*out_width, *in_width}:
        w = np.asarray(producers[conv.operands[1]].attrs["data"])
        o, i = out_width.get(conv, w.shape[0]), in_width.get(conv, w.shape[3])
        padded[conv.operands[1]] = np.pad(w, [(0, o - w.shape[0]), (0, 0), (0, 0), (0, i - w.shape[3])])
        if conv.operands[2] is not None:
            padded[conv.operands[2]] = np.pad(np.asarray(producers[conv.operands[2]].attrs["data"]),
                                              (0, o - w.shape[0]))
            if conv.operands[1].type.quant.is_per_channel and o > w.shape[0]:
                per_channel_bias.add(conv.operands[2])   # more channels: per channel, as its accumulator

    def rewrite(b: GraphBuilder, op: Op, operands) -> tuple[Value, ...] | None:
        if op.kind != "constant" or op.result not in padded:
            return None
        data = padded[op.result]
        quant = op.attrs["quant"]
        if op.result in per_channel_bias and not quant.is_per_channel:
            quant = dataclasses.replace(quant, scale=quant.scale * op.result.type.shape[0],
                                        zero_point=quant.zero_point * op.result.type.shape[0], axis=0)
        quant = _extended(quant, data.shape[0] - op.result.type.shape[0])
        return (b.constant(data, quant, name=op.result.name, origin=op.origin),)

    return rebuild(graph, rewrite)


class ChannelWidening(Rewrite):
    """``widen`` as a rewrite: exact (every original channel of every value keeps its codes; a
    widened tensor's extra channels hold the zero point)."""

    name = "ethosu.widen_channels"
    steps = 0
    what = "runs of convolution tensors padded with zero channels where Vela costs them lower"

    def __init__(self, widths: dict[str, int]):
        self.widths = widths

    def apply(self, graph: Graph) -> Rewritten:
        return Rewritten(widen(graph, self.widths))


def _extended(q, extra: int):
    """A per-channel quantization with ``extra`` channels more (the last channel's scale, zero point 0)."""
    if q is None or not q.is_per_channel:
        return q
    return dataclasses.replace(q, scale=q.scale + (q.scale[-1],) * extra, zero_point=q.zero_point + (0,) * extra)


def narrowed_tensors(graph: Graph, widths: dict[str, int]) -> dict[str, int]:
    """IR value name -> its own channel count, for every tensor of the runs ``widths`` widens."""
    return {v.name: run.channels for run in runs(graph) if run.name in widths for v in sorted(run.values, key=str)}


def unpad_traced(value: np.ndarray, channels: int) -> np.ndarray:
    """A traced tensor of a widened run as the program sees it: its first ``channels`` channels."""
    return value[..., :channels] if value.ndim == 4 and value.shape[3] > channels else value
