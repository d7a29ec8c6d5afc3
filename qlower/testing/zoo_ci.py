"""Zoo models at the sizes CI runs them, where ``zoo.get``'s ``size`` can't reach.

``lstm_kws`` has a fixed 49-frame input, and the exported LSTM is unrolled: one group of gate ops per
frame, so every stage (PT2E, import, each backend, Vulkan's per-operator shaders) costs in proportion to
the frame count. CI runs it over the first ``LSTM_CI_FRAMES`` frames of the same inputs, with the same
weights: the same operators and the same recurrence, carried over fewer steps.
"""

from __future__ import annotations

from qlower import zoo
from qlower.zoo._common import ZooModel

LSTM_CI_FRAMES = 16


def _first_frames(batch: tuple) -> tuple:
    return tuple(x[:, :LSTM_CI_FRAMES].contiguous() for x in batch)


def get(name: str, size: int | None = None) -> ZooModel:
    """``zoo.get(name, size)``, with ``lstm_kws``'s inputs and calibration cut to ``LSTM_CI_FRAMES`` frames."""
    built = zoo.get(name, size)
    if name != "lstm_kws":
        return built
    return built._replace(example_inputs=_first_frames(built.example_inputs),
                          calibration_batches=[_first_frames(b) for b in built.calibration_batches])
