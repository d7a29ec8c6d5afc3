"""Graph passes and the manager that runs and verifies them (DESIGN.md rule 3).

``default_pipeline()`` is what ``qlower.compile`` runs: constant folding,
transpose cancellation, exact activation fusion and dead code elimination,
repeated until nothing changes (at most ``max_iterations`` sweeps).
"""

from qlower.passes.activation_fusion import fuse_activations
from qlower.passes.constant_folding import FoldConstants, fold_constants
from qlower.passes.dce import eliminate_dead_code
from qlower.passes.manager import Pass, PassManager, PassRecord, PassResult, pass_name
from qlower.passes.transposes import cancel_transposes


def default_pipeline(verify: bool = False, max_iterations: int = 8) -> PassManager:
    """The compile pipeline. ``verify=True`` (tests, ``--verify-passes``) checks the graph after
    every pass; without it the final graph is still checked once."""
    return PassManager([fold_constants, cancel_transposes, fuse_activations, eliminate_dead_code],
                       verify=verify, max_iterations=max_iterations)


__all__ = [
    "FoldConstants", "Pass", "PassManager", "PassRecord", "PassResult", "cancel_transposes",
    "default_pipeline", "eliminate_dead_code", "fold_constants", "fuse_activations", "pass_name",
]
