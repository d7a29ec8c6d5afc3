"""The int32 domain in which a quantized add (or sub) sums its operands.

TFLite's int8 ADD shifts both centered operands left by ``ADD_SHIFT`` bits and
rescales them to ``2 * max(s_a, s_b) / 2**ADD_SHIFT``: 20 bits of headroom keep the
rounding of the two operand rescales far below a step of the output, and the sum of
two int8 codes so scaled stays within int32. The importer builds every int8 add in
this domain, and the litert backend recognises those adds by it, so both read this
one definition.
"""

from __future__ import annotations

from collections.abc import Sequence

ADD_SHIFT = 20


def add_domain_scale(scales: Sequence[float], shift: int = ADD_SHIFT) -> float:
    """The scale of the int32 sum of operands quantized at ``scales``."""
    return 2.0 * max(scales) / 2**shift
