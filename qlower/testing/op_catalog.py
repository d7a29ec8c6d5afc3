"""A catalogue of tiny PyTorch modules, one per op, grouped by family: what coverage is measured on.

Each ``OpCase`` is data: the op under test (a module factory), its input shapes
and the kind of each input. ``case.build()`` wraps the op so that its inputs are
realistic: an ``"act"`` input goes through a layer first (a 1x1 conv for 4-D
inputs, a linear layer on the last dimension otherwise), so the op reads a
quantized activation; a ``"float"`` / ``"pos"`` input reaches the op directly
(PT2E decides whether it is quantized); ``"tokens"``, ``"int"`` and ``"bool"``
inputs are integer and bool graph inputs. The op always lives in the submodule
named ``OP_MODULE``, which is how a compiled program's IR ops are traced back to
it (their ``Origin.module``). Inputs are drawn from a generator seeded per case
(``case.seed``), so every run sees the same numbers.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

OP_MODULE = "op"
INPUT_KINDS = ("act", "float", "pos", "tokens", "int", "bool")
VOCAB = 10


class Fn(nn.Module):
    """A function of the inputs as a module, with optional constant tensors (``self.c0`` ...) as buffers."""

    def __init__(self, fn: Callable, *consts: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        self.n_consts = len(consts)
        for i, c in enumerate(consts):
            self.register_buffer(f"c{i}", c)

    def forward(self, *xs):
        return self.fn(*xs, *(getattr(self, f"c{i}") for i in range(self.n_consts)))


class CaseModule(nn.Module):
    """``pre`` layers (one per input) feeding the op under test, which is ``self.op``."""

    def __init__(self, pre: list[nn.Module], op: nn.Module) -> None:
        super().__init__()
        self.pre = nn.ModuleList(pre)
        self.add_module(OP_MODULE, op)

    def forward(self, *xs):
        return getattr(self, OP_MODULE)(*(p(x) for p, x in zip(self.pre, xs)))


def _pre_layer(shape: tuple[int, ...], kind: str) -> nn.Module:
    if kind != "act":
        return nn.Identity()
    if len(shape) == 4:
        return nn.Conv2d(shape[1], shape[1], 1)
    return nn.Linear(shape[-1], shape[-1])


@dataclass(frozen=True)
class OpCase:
    family: str
    name: str
    module_factory: Callable[[], nn.Module]
    input_shapes: tuple[tuple[int, ...], ...]
    input_kinds: tuple[str, ...]
    note: str = field(default="", compare=False)

    @property
    def seed(self) -> int:
        """Fixed per case (a checksum of its name), for its weights and its inputs."""
        return zlib.crc32(self.name.encode()) & 0x7FFFFFFF

    @property
    def key(self) -> str:
        return f"{self.family}/{self.name}"

    def build(self) -> nn.Module:
        """The eval-mode wrapped module (weights from ``seed``)."""
        torch.manual_seed(self.seed)
        pre = [_pre_layer(s, k) for s, k in zip(self.input_shapes, self.input_kinds)]
        return CaseModule(pre, self.module_factory()).eval()

    def inputs(self, batch: int = 0) -> tuple[torch.Tensor, ...]:
        """Input tensors number ``batch`` (0: the example; 1..: more calibration batches), reproducible."""
        g = torch.Generator().manual_seed(self.seed * 7 + batch)
        out = []
        for shape, kind in zip(self.input_shapes, self.input_kinds):
            if kind in ("act", "float"):
                out.append(torch.randn(shape, generator=g))
            elif kind == "pos":
                out.append(torch.rand(shape, generator=g) * 1.5 + 0.5)
            elif kind == "tokens":
                out.append(torch.randint(0, VOCAB, shape, generator=g, dtype=torch.int64))
            elif kind == "int":
                out.append(torch.randint(-4, 5, shape, generator=g, dtype=torch.int64))
            elif kind == "bool":
                out.append(torch.rand(shape, generator=g) > 0.5)
            else:
                raise ValueError(f"{self.key}: unknown input kind {kind!r}; known: {', '.join(INPUT_KINDS)}")
        return tuple(out)

    def calibration(self, n: int = 3) -> list[tuple[torch.Tensor, ...]]:
        return [self.inputs(i) for i in range(n)]


X4 = (1, 4, 4, 4)   # a small NCHW activation
X5 = (1, 4, 5, 5)   # odd spatial size: padding, ceil mode and non-divisor pooling show up
ROW = (1, 8)        # a small vector activation
SEQ = (1, 5, 8)     # batch, tokens, features

CASES: list[OpCase] = []


def _add(family: str, name: str, op: Callable[[], nn.Module] | Callable, shapes, kinds=None, note: str = "") -> None:
    """Register a case; ``op`` is a module factory (a module class, or a callable marked by ``factory``)
    or a plain function of the inputs (wrapped in ``Fn``). ``kinds`` default to ``"act"`` for every input."""
    shapes = tuple(tuple(s) for s in shapes)
    kinds = tuple(kinds) if kinds is not None else ("act",) * len(shapes)
    if isinstance(op, type) or getattr(op, "_is_factory", False):
        make = op
    else:
        def make(fn=op):
            return Fn(fn)
    CASES.append(OpCase(family, name, make, shapes, kinds, note))


def factory(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """Mark ``make`` as building the op's module (rather than being the op's function)."""
    make._is_factory = True
    return make


# --- elementwise ------------------------------------------------------------------------------------------
E = "elementwise"
for _name, _fn in [("abs", torch.abs), ("neg", torch.neg), ("exp", torch.exp),
                   ("div_const", lambda x: x / 3.0), ("pow_scalar", lambda x: x ** 2)]:
    _add(E, _name, _fn, [X4])
for _name, _fn in [("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt), ("log", torch.log),
                   ("reciprocal", torch.reciprocal)]:
    _add(E, _name, _fn, [X4], ["pos"], note="positive float input")
_add(E, "div_tensor", torch.div, [X4, X4], ["act", "pos"])
_add(E, "minimum", torch.minimum, [X4, X4])
_add(E, "maximum", torch.maximum, [X4, X4])
_add(E, "clamp_tensor", factory(lambda: Fn(lambda x, lo, hi: torch.clamp(x, min=lo, max=hi),
                                           torch.tensor([-1.0, -0.5, -0.2, 0.0]).view(1, 4, 1, 1),
                                           torch.tensor([0.3, 0.5, 1.0, 2.0]).view(1, 4, 1, 1))), [X4])
_add(E, "where", lambda a, b: torch.where(a > b, a, b), [X4, X4], note="condition from a comparison")
for _name, _fn in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt),
                   ("ge", torch.ge)]:
    _add(E, _name, _fn, [X4, X4])
_add(E, "logical_and", torch.logical_and, [X4, X4], ["bool", "bool"])
_add(E, "logical_or", torch.logical_or, [X4, X4], ["bool", "bool"])
_add(E, "logical_not", torch.logical_not, [X4], ["bool"])

# --- activations ------------------------------------------------------------------------------------------
A = "activation"
for _name, _fn in [("leaky_relu", lambda x: F.leaky_relu(x, 0.1)), ("elu", F.elu),
                   ("gelu_erf", F.gelu), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
                   ("silu", F.silu), ("mish", F.mish), ("hardswish", F.hardswish),
                   ("hardsigmoid", F.hardsigmoid), ("softplus", F.softplus), ("celu", F.celu), ("selu", F.selu),
                   ("glu", lambda x: F.glu(x, dim=1))]:
    _add(A, _name, _fn, [X4])
_add(A, "log_softmax", lambda x: F.log_softmax(x, dim=-1), [SEQ])
_add(A, "prelu", factory(lambda: nn.PReLU(4, init=0.2)), [X4])

# --- reductions -------------------------------------------------------------------------------------------
R = "reduction"
for _name, _fn in [("sum_hw_keep", lambda x: x.sum(dim=(2, 3), keepdim=True)),
                   ("sum_c", lambda x: x.sum(dim=1)),
                   ("mean_hw_keep", lambda x: x.mean(dim=(2, 3), keepdim=True)),
                   ("mean_w", lambda x: x.mean(dim=-1)),
                   ("amax_c_keep", lambda x: x.amax(dim=1, keepdim=True)),
                   ("amax_hw", lambda x: x.amax(dim=(2, 3))),
                   ("amin_w_keep", lambda x: x.amin(dim=3, keepdim=True)),
                   ("amin_ch", lambda x: x.amin(dim=(1, 2))),
                   ("max_indices_c", lambda x: torch.max(x, dim=1)),
                   ("min_indices_h_keep", lambda x: torch.min(x, dim=2, keepdim=True)),
                   ("argmax_c", lambda x: torch.argmax(x, dim=1)),
                   ("argmax_w_keep", lambda x: torch.argmax(x, dim=3, keepdim=True)),
                   ("var_hw_keep", lambda x: torch.var(x, dim=(2, 3), keepdim=True)),
                   ("var_c", lambda x: torch.var(x, dim=1)),
                   ("cumsum", lambda x: torch.cumsum(x, dim=3))]:
    _add(R, _name, _fn, [X4])

# --- normalisation ----------------------------------------------------------------------------------------
N = "normalisation"


@factory
def _batch_norm() -> nn.Module:
    bn = nn.BatchNorm2d(4)
    bn.running_mean.copy_(torch.randn(4) * 0.3)
    bn.running_var.copy_(torch.rand(4) + 0.5)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    return bn


_add(N, "layer_norm", factory(lambda: nn.LayerNorm(8)), [SEQ])
_add(N, "group_norm", factory(lambda: nn.GroupNorm(2, 4)), [X4])
_add(N, "batch_norm_unfolded", _batch_norm, [X4], ["float"], note="no conv before it to fold into")
_add(N, "instance_norm", factory(lambda: nn.InstanceNorm2d(4, affine=True)), [X4])

# --- linear algebra ---------------------------------------------------------------------------------------
L = "linalg"
_add(L, "mm", torch.mm, [(4, 8), (8, 6)])
_add(L, "addmm", factory(lambda: Fn(lambda a, b, c: torch.addmm(c, a, b), torch.randn(6))), [(4, 8), (8, 6)])
_add(L, "baddbmm", torch.baddbmm, [(2, 4, 6), (2, 4, 8), (2, 8, 6)])
_add(L, "bmm", torch.bmm, [(2, 4, 8), (2, 8, 6)])
_add(L, "matmul_broadcast", torch.matmul, [(2, 1, 4, 8), (3, 8, 6)], note="batch dims broadcast")
_add(L, "matmul_vec_mat", torch.matmul, [(8,), (8, 6)])
_add(L, "matmul_mat_vec", torch.matmul, [(4, 8), (8,)])
_add(L, "sdpa", F.scaled_dot_product_attention, [(1, 2, 4, 8)] * 3)
_add(L, "sdpa_mask", factory(lambda: Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                                        torch.ones(4, 4, dtype=torch.bool).tril())), [(1, 2, 4, 8)] * 3,
     note="bool causal mask")
_add(L, "conv_transpose1d", factory(lambda: nn.ConvTranspose1d(4, 4, 3, stride=2)), [(1, 4, 6)], ["float"])
_add(L, "conv_transpose2d", factory(lambda: nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1)),
     [X4], ["float"])
_add(L, "conv1d_dilated_grouped", factory(lambda: nn.Conv1d(4, 8, 3, dilation=2, groups=2)), [(1, 4, 10)],
     ["float"])
_add(L, "conv2d_dilated_grouped", factory(lambda: nn.Conv2d(4, 8, 3, dilation=2, groups=2, padding=2)),
     [(1, 4, 6, 6)], ["float"])

# --- data movement ----------------------------------------------------------------------------------------
D = "data"
for _name, _fn, _shape in [
        ("split", lambda x: torch.split(x, [1, 3], dim=1), X4),
        ("chunk", lambda x: torch.chunk(x, 2, dim=2), X4),
        ("unbind", lambda x: torch.unbind(x, dim=1), X4),
        ("select", lambda x: x[:, 1], X4),
        ("narrow", lambda x: torch.narrow(x, 3, 1, 2), X4),
        ("flip", lambda x: torch.flip(x, dims=(2, 3)), X4),
        ("roll", lambda x: torch.roll(x, shifts=1, dims=3), X4),
        ("repeat", lambda x: x.repeat(1, 2, 1, 1), X4),
        ("expand", lambda x: x.expand(1, 4, 3, 4), (1, 4, 1, 4)),
        ("tile", lambda x: torch.tile(x, (2, 1)), SEQ),
        ("unsqueeze", lambda x: x.unsqueeze(1), SEQ),
        ("squeeze", lambda x: x.squeeze(2), (1, 4, 1, 4)),
        ("flatten", lambda x: torch.flatten(x, 1), X4),
        ("unflatten", lambda x: x.unflatten(2, (2, 4)), SEQ),
        ("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), (1, 8, 2, 2)),
        ("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 2), (1, 2, 4, 4)),
        ("pad_constant", lambda x: F.pad(x, (1, 1, 2, 0), value=0.5), X4),
        ("pad_reflect", lambda x: F.pad(x, (1, 1, 1, 2), mode="reflect"), X4),
        ("pad_replicate", lambda x: F.pad(x, (1, 2, 0, 1), mode="replicate"), X4)]:
    _add(D, _name, _fn, [_shape])
_add(D, "stack", lambda a, b: torch.stack((a, b), dim=1), [X4, X4])
_add(D, "index_select", factory(lambda: Fn(lambda x, i: torch.index_select(x, 1, i), torch.tensor([2, 0, 3]))),
     [X4])
_add(D, "gather", factory(lambda: Fn(lambda x, i: torch.gather(x, 3, i),
                                     torch.tensor([[0, 3], [1, 1], [2, 0], [3, 2]]).expand(1, 4, 4, 2).contiguous())),
     [X4])
_add(D, "embedding", factory(lambda: nn.Embedding(VOCAB, 8)), [(1, 5)], ["tokens"], note="int64 token ids")

# --- resampling and pooling -------------------------------------------------------------------------------
P = "resampling"
for _name, _fn, _shape in [
        ("nearest_x2", lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), X4),
        ("bilinear", lambda x: F.interpolate(x, size=(7, 7), mode="bilinear", align_corners=False), X4),
        ("bilinear_align_corners", lambda x: F.interpolate(x, size=(7, 7), mode="bilinear", align_corners=True), X4),
        ("adaptive_avg_pool_3x3", lambda x: F.adaptive_avg_pool2d(x, (3, 3)), X5),
        ("avg_pool_pad_incl", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True), X5),
        ("avg_pool_pad_excl", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), X5),
        ("avg_pool_ceil", lambda x: F.avg_pool2d(x, 2, 2, ceil_mode=True), X5),
        ("avg_pool_floor", lambda x: F.avg_pool2d(x, 2, 2, ceil_mode=False), X5),
        ("avg_pool_divisor", lambda x: F.avg_pool2d(x, 2, 2, divisor_override=3), X4),
        ("max_pool_dilated", lambda x: F.max_pool2d(x, 2, 1, dilation=2), X5)]:
    _add(P, _name, _fn, [_shape])

# --- corners ----------------------------------------------------------------------------------------------
C = "corner"
_add(C, "add_alpha", lambda a, b: torch.add(a, b, alpha=2), [X4, X4])
_add(C, "sub_alpha", lambda a, b: torch.sub(a, b, alpha=0.5), [X4, X4])
_add(C, "int_input_add", lambda a, i: a + i, [ROW, ROW], ["act", "int"], note="float + int64 graph input")
_add(C, "conv1x1_one_channel_batch2", factory(lambda: nn.Conv2d(1, 1, 1)), [(2, 1, 4, 8)], ["float"],
     note="a 1-channel conv is also depthwise; batch 2")
_add(C, "int_input_only", lambda i: i * 3 + 1, [ROW], ["int"], note="integer arithmetic on an int64 graph input")

FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(c.family for c in CASES))
_BY_KEY = {c.key: c for c in CASES}
if len(_BY_KEY) != len(CASES):
    raise RuntimeError("op catalogue: duplicate case names")


def cases(family: str | None = None) -> list[OpCase]:
    """Every case (of ``family``), in a fixed order."""
    return [c for c in CASES if family is None or c.family == family]


def get(key: str) -> OpCase:
    """The case ``family/name``."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown op case {key!r}") from None
