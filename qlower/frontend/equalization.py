"""Cross-layer equalization and high-bias absorption (Nagel et al. 2019, "Data-Free Quantization"),
on the exported float graph.

Two consecutive layers ``y = W2 f(W1 x + b1)`` where ``f`` is the identity, ReLU, a leaky ReLU or a
clamp ``[0, M]`` (ReLU6) compute the same function when output channel ``i`` of the first is divided
by ``s_i > 0`` and input channel ``i`` of the second multiplied by it: these activations commute
with a positive scale, and the clamp's bound becomes ``M / s_i``. With ``s_i = sqrt(r1_i / r2_i)``
(``r1_i`` = max |W1| over what makes output channel ``i``, ``r2_i`` = max |W2| over what reads input
channel ``i``) both ranges become ``sqrt(r1_i * r2_i)``, so a per-tensor weight scale no longer has
to cover one channel's outliers at the expense of all the others (depthwise convolutions after
BatchNorm folding are the classic case). Chains are swept until the scales settle.

Layers: conv1d/2d (any groups, depthwise with a channel multiplier included), transposed convs (any
groups) and linear. Which weight element reads which input channel and makes which output channel
is one index map per layer (``_channel_maps``), so grouped, depthwise and transposed layers need no
case of their own. A pair is two layers of the same channel axis (conv-like: dim 1, linear: the last
dim), the first's result (or its activation's) read by the second alone, as its input, each layer
owning its weight and bias. Padding is zeros (a non-zero pad is an explicit op between the layers:
no pair), and zero scales to zero. BatchNorms must be folded first (batch_norm_fold.py). The float
function is unchanged up to float rounding (tests/test_quant_methods.py, on random nets and on every
trained zoo model).

Before any range is measured, the taps of a conv that read only zero padding at the graph's (static)
input size are zeroed (``zero_unread_taps``): exact, since they multiply zeros at every output
position, and a range is then set by the weights that meet data. At small inputs they are common: a
5x5 depthwise conv on a 1x1 feature map reads its centre tap alone, yet its 24 others set its per-tensor
range (MobileNetV3-Small at 32x32: with 4-bit weights those layers' outputs were noise, 0 dB SQNR, and
the model's output 3.6 dB; with the unread taps zeroed, 11 dB).

A per-channel bound has no place in one per-tensor requantization, so a ReLU6 whose bounds now
differ becomes ``clamp(y, 0, max_i M_i)`` (still fused into the first layer) followed by
``minimum(., M)``, a pick in the same quantization domain: exact in float and in integers.

High-bias absorption (``absorb_bias``): where the first layer's output channel ``i`` is at least
``c_i > 0`` on every calibration sample, ``f(y) = f(y - c_i) + c_i`` there (ReLU; ReLU6 with its
bound lowered to ``M - c_i``), so ``c_i`` leaves the first bias and ``W2 c`` joins the second's,
narrowing the activation's range. Exact wherever the first layer's output stays >= ``c`` (on the
calibration data by construction); an input that drives a channel below its ``c`` sees the
activation clip at ``c`` instead of 0. Only into a linear or an unpadded conv (every output reads
the whole kernel window, so ``W2 c`` is one constant per output channel), and only from a first
layer with a bias.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Interpreter, Node

from qlower.frontend.constants import attribute_tensor, owned_attribute, set_attribute_tensor, set_layer_bias

aten = torch.ops.aten

CONVS = {aten.conv1d.default, aten.conv1d.padding, aten.conv2d.default, aten.conv2d.padding}
TRANSPOSED = {aten.conv_transpose1d.default, aten.conv_transpose2d.input}
LINEAR = aten.linear.default
LAYERS = CONVS | TRANSPOSED | {LINEAR}
SWEEPS = 20
SETTLED = 1e-4  # a sweep whose scales all lie within this of 1 ends the search
SCALE_LIMIT = 1e4  # no channel is rescaled by more (a dead channel keeps scale 1)


@dataclass
class Pair:
    first: Node
    second: Node
    activation: Node | None  # between them: ReLU, leaky ReLU or a [0, M] clamp (``clamp_top``)
    clamp_top: float | None
    total: torch.Tensor  # the product of the scales applied so far, per channel
    absorbed: torch.Tensor | None = field(default=None)  # per channel, in the scaled units


def _arg(node: Node, name: str, default: object) -> object:
    """Argument ``name`` of an aten call, positional or keyword."""
    for i, a in enumerate(node.target._schema.arguments):
        if a.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, default)
    return default


def _channel_maps(node: Node, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output channel, input channel) of every element of ``node``'s weight, as index tensors of its shape.

    conv ``[O, I/g, k..]``: element ``[o, j]`` reads input channel ``(o // (O/g)) * I/g + j``;
    transposed conv ``[I, O/g, k..]``: element ``[i, j]`` makes output ``(i // (I/g)) * O/g + j``."""
    a, b = weight.shape[:2]
    rows, cols = torch.arange(a)[:, None], torch.arange(b)[None, :]
    groups = 1 if node.target is LINEAR else int(_arg(node, "groups", 1))
    grouped = (rows // (a // groups)) * b + cols
    out_map, in_map = (grouped, rows) if node.target in TRANSPOSED else (rows, grouped if node.target in CONVS else cols)
    shape = (a, b) + (1,) * (weight.dim() - 2)
    return out_map.expand(a, b).reshape(shape).expand(weight.shape), in_map.expand(a, b).reshape(shape).expand(weight.shape)


def _channels(node: Node, weight: torch.Tensor) -> tuple[int, int]:
    """(output channels, input channels) of a layer."""
    out_map, in_map = _channel_maps(node, weight)
    return int(out_map.max()) + 1, int(in_map.max()) + 1


def _ranges(w: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """max |w| over the elements of each channel of ``index``."""
    w = w.detach().to(torch.float64).abs()
    return torch.zeros(n, dtype=torch.float64).scatter_reduce(0, index.reshape(-1), w.reshape(-1), "amax")


def _activation(node: Node) -> tuple[bool, float | None]:
    """(commutes with a positive per-channel scale, the top M of a ``[0, M]`` clamp)."""
    if node.op != "call_function":
        return False, None
    if node.target in (aten.relu.default, aten.relu_.default, aten.leaky_relu.default, aten.leaky_relu_.default):
        return True, None
    if node.target in (aten.relu6.default, aten.relu6_.default):
        return True, 6.0
    if node.target in (aten.hardtanh.default, aten.hardtanh_.default):
        lo, hi = _arg(node, "min_val", -1.0), _arg(node, "max_val", 1.0)
        if lo == 0 and isinstance(hi, (int, float)) and hi > 0:
            return True, float(hi)
    return False, None


def _is_layer(node: Node, attr_uses: Counter) -> bool:
    """A conv / linear that alone reads its (constant) weight and bias."""
    if node.op != "call_function" or node.target not in LAYERS or len(node.args) < 2:
        return False
    bias = _arg(node, "bias", None)
    return owned_attribute(node.args[1], attr_uses) and (bias is None or owned_attribute(bias, attr_uses))


def find_pairs(gm: GraphModule, linear_only: bool = False) -> list[Pair]:
    """The layer pairs whose shared channels can be rescaled without changing the function (see above)."""
    attr_uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    pairs = []
    for first in gm.graph.nodes:
        if not _is_layer(first, attr_uses) or len(first.users) != 1:
            continue
        middle = next(iter(first.users))
        homogeneous, top = _activation(middle)
        activation = middle if homogeneous else None
        if activation is not None:
            if len(middle.users) != 1 or middle.args[0] is not first:
                continue
            second = next(iter(middle.users))
        else:
            middle, second = first, middle
        if not _is_layer(second, attr_uses) or second.args[0] is not middle or middle in second.args[1:]:
            continue
        if (first.target is LINEAR) != (second.target is LINEAR) or (linear_only and first.target is not LINEAR):
            continue  # a conv's channels are dim 1, a linear's the last
        w1, w2 = _weight(gm, first), _weight(gm, second)
        if w1.dim() != w2.dim() or _channels(first, w1)[0] != _channels(second, w2)[1]:
            continue
        channels = _channels(first, w1)[0]
        pairs.append(Pair(first, second, activation, top, torch.ones(channels, dtype=torch.float64)))
    return pairs


def _weight(gm: GraphModule, node: Node) -> torch.Tensor:
    return attribute_tensor(gm, node.args[1])


def rescale(gm: GraphModule, pair: Pair, s: torch.Tensor) -> None:
    """Output channel i of ``first`` divided by ``s_i``, input channel i of ``second`` multiplied."""
    w1 = _weight(gm, pair.first).detach().to(torch.float64)
    set_attribute_tensor(gm, pair.first.args[1].target, w1 / s[_channel_maps(pair.first, w1)[0]])
    bias = _arg(pair.first, "bias", None)
    if bias is not None:
        set_attribute_tensor(gm, bias.target, attribute_tensor(gm, bias).detach().to(torch.float64) / s)
    w2 = _weight(gm, pair.second).detach().to(torch.float64)
    set_attribute_tensor(gm, pair.second.args[1].target, w2 * s[_channel_maps(pair.second, w2)[1]])
    pair.total *= s


def _ints(value: object, dims: int) -> list[int] | None:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * dims
    return [int(v) for v in values] if len(values) == dims and all(isinstance(v, int) for v in values) else None


def read_taps(node: Node) -> torch.Tensor | None:
    """Which taps of the conv ``node``'s kernel (a bool tensor of its spatial shape) read input data at
    some output position, not only zero padding; None when the shapes are not static."""
    x, w, y = (getattr(a, "meta", {}).get("val") for a in (node.args[0], node.args[1], node))
    if not all(isinstance(t, torch.Tensor) for t in (x, w, y)):
        return None
    dims = w.dim() - 2
    stride, padding, dilation = (_ints(_arg(node, k, d), dims) for k, d in (("stride", 1), ("padding", 0),
                                                                            ("dilation", 1)))
    shapes = [x.shape[-dims:], w.shape[2:], y.shape[-dims:]] if dims > 0 else []
    if None in (stride, padding, dilation) or dims < 1 or not all(isinstance(s, int) for t in shapes for s in t):
        return None
    read = torch.ones((), dtype=torch.bool)
    for d in range(dims):
        taps = torch.arange(w.shape[2 + d])
        where = torch.arange(y.shape[-dims + d])[:, None] * stride[d] - padding[d] + taps[None, :] * dilation[d]
        along = ((where >= 0) & (where < x.shape[-dims + d])).any(0)
        read = read[..., None] & along
    return read


def zero_unread_taps(gm: GraphModule) -> int:
    """Zero, in place, the kernel taps of every conv (owning its weight) that read only its zero padding;
    returns how many convs changed. The function is unchanged: those taps only ever multiply zeros."""
    attr_uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.conv1d.default, aten.conv2d.default):
            continue  # (the .padding variants, padding "same" / "valid", are left as they are)
        if not owned_attribute(node.args[1], attr_uses):
            continue
        read = read_taps(node)
        if read is None or bool(read.all()):
            continue
        w = attribute_tensor(gm, node.args[1]).detach()
        set_attribute_tensor(gm, node.args[1].target, torch.where(read, w, torch.zeros_like(w)))
        changed += 1
    return changed


def equalize(gm: GraphModule, batches: list[tuple] | None = None, absorb_bias: bool = False) -> int:
    """Equalize, in place, every pair of layers described above (and absorb high biases, on the
    calibration ``batches``, when ``absorb_bias``), after zeroing the taps that read only padding;
    returns how many pairs changed."""
    zero_unread_taps(gm)
    pairs = find_pairs(gm)
    for _ in range(SWEEPS):
        largest = 0.0
        for pair in pairs:
            w1, w2 = _weight(gm, pair.first), _weight(gm, pair.second)
            n = len(pair.total)
            r1 = _ranges(w1, _channel_maps(pair.first, w1)[0], n)
            r2 = _ranges(w2, _channel_maps(pair.second, w2)[1], n)
            s = torch.where((r1 > 0) & (r2 > 0), torch.sqrt(r1 / r2.clamp_min(1e-300)), torch.ones_like(r1))
            s = s.clamp(1 / SCALE_LIMIT, SCALE_LIMIT)
            largest = max(largest, float((s.log().abs()).max()) if len(s) else 0.0)
            rescale(gm, pair, s)
        if largest < SETTLED:
            break
    if absorb_bias and batches:
        gm.recompile()
        _absorb_high_biases(gm, pairs, batches)
    changed = [p for p in pairs if not torch.all(p.total == 1) or p.absorbed is not None]
    for pair in changed:
        if pair.clamp_top is not None:
            split_clamp(gm, pair)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return len(changed)


class _ChannelReduce(Interpreter):
    def __init__(self, gm: GraphModule, axes: dict[Node, int], least: bool, magnitude: bool) -> None:
        super().__init__(gm)
        self.axes, self.least, self.magnitude = axes, least, magnitude
        self.found: dict[Node, torch.Tensor] = {}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if n in self.axes:
            axis = self.axes[n] % out.dim()
            x = out.detach().abs() if self.magnitude else out.detach()
            x = x.movedim(axis, 0).reshape(out.shape[axis], -1).to(torch.float64)
            m = x.amin(1) if self.least else x.amax(1)
            old = self.found.get(n)
            self.found[n] = m if old is None else (torch.minimum if self.least else torch.maximum)(old, m)
        return out


def channel_extremes(gm: GraphModule, axes: dict[Node, int], batches: list[tuple], least: bool = False,
                     magnitude: bool = False) -> dict[Node, torch.Tensor]:
    """Per node of ``axes``, per channel of its axis: the least (or largest) value, of ``|x|`` when
    ``magnitude``, over every calibration batch run through the float graph."""
    stats = _ChannelReduce(gm, axes, least, magnitude)
    with torch.no_grad():
        for batch in batches:
            stats.run(*batch)
    return stats.found


def _absorbable(pair: Pair) -> bool:
    if pair.activation is None or pair.activation.target in (aten.leaky_relu.default, aten.leaky_relu_.default):
        return False  # only where f(y) = f(y - c) + c for y >= c
    if _arg(pair.first, "bias", None) is None or pair.second.target in TRANSPOSED:
        return False
    if pair.second.target is LINEAR:
        return True
    padding = _arg(pair.second, "padding", 0)
    if isinstance(padding, str):
        return padding == "valid"
    return all(int(p) == 0 for p in (padding if isinstance(padding, (list, tuple)) else [padding]))


def _absorb_high_biases(gm: GraphModule, pairs: list[Pair], batches: list[tuple]) -> None:
    candidates = [p for p in pairs if _absorbable(p)]
    if not candidates:
        return
    least_seen = channel_extremes(gm, {p.first: -1 if p.first.target is LINEAR else 1 for p in candidates}, batches,
                                  least=True)
    attr_uses = Counter(n.target for n in gm.graph.nodes if n.op == "get_attr")
    for pair in candidates:
        least = least_seen.get(pair.first)
        if least is None:
            continue
        c = least.clamp_min(0)
        if pair.clamp_top is not None:
            c = torch.minimum(c, pair.clamp_top / pair.total)
        if not bool((c > 0).any()):
            continue
        bias1 = _arg(pair.first, "bias", None)
        set_attribute_tensor(gm, bias1.target, attribute_tensor(gm, bias1).detach().to(torch.float64) - c)
        w2 = _weight(gm, pair.second).detach().to(torch.float64)
        shift = (w2 * c[_channel_maps(pair.second, w2)[1]]).reshape(w2.shape[0], -1).sum(1)
        bias2 = _arg(pair.second, "bias", None)
        old = torch.zeros_like(shift) if bias2 is None else attribute_tensor(gm, bias2).detach().to(torch.float64)
        set_layer_bias(gm, pair.second, old + shift, attr_uses)
        pair.absorbed = c


def split_clamp(gm: GraphModule, pair: Pair) -> None:
    """``hardtanh(y, 0, M)`` on channels scaled by ``1 / total`` (less what was absorbed) →
    ``hardtanh(y, 0, max_i M_i)``, then ``minimum`` with the per-channel bounds ``M_i`` (left out if
    they are all equal)."""
    clamp = pair.activation
    bounds = pair.clamp_top / pair.total
    if pair.absorbed is not None:
        bounds = bounds - pair.absorbed
    bounds = bounds.to(torch.float32)
    widest = float(bounds.max())
    clamp.target, clamp.args, clamp.kwargs = aten.hardtanh.default, (clamp.args[0], 0.0, widest), {}
    if torch.all(bounds == widest):
        return
    dims = clamp.meta["val"].dim() if isinstance(clamp.meta.get("val"), torch.Tensor) else 4
    shape = (-1,) if pair.first.target is LINEAR else (-1,) + (1,) * (dims - 2)
    name = f"equalized_bound_{pair.first.args[1].target.replace('.', '_')}"
    gm.register_buffer(name, bounds.reshape(shape).clone())
    with gm.graph.inserting_after(clamp):
        bound = gm.graph.get_attr(name)
    fake_mode = getattr(clamp.meta.get("val"), "fake_mode", None)
    value = getattr(gm, name)
    bound.meta["val"] = fake_mode.from_tensor(value, static_shapes=True) if fake_mode is not None else value
    with gm.graph.inserting_after(bound):
        picked = gm.graph.call_function(aten.minimum.default, (clamp, bound))
    picked.meta.update({k: v for k, v in clamp.meta.items() if k != "quantization_annotation"})
    pair.second.replace_input_with(clamp, picked)
