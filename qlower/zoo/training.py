"""The training loop of the zoo's trained models: Adam(W), cosine schedule, seeded shuffling.

Deterministic in everything qlower controls: the initial weights come from
``seed`` (drawn inside ``seeded``, the caller's RNG untouched) and the batch
order and augmentation from private generators. Training runs on one thread: float
sums split over another number of threads round differently, and MobileNetV2
trained on 2 threads reached 96% where 1 thread gave 90%, so the weights (and the
accuracies the tests check) must not depend on the machine's core count. One
thread also keeps parallel test workers from oversubscribing the cores.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from qlower.backends.threads import torch_threads
from qlower.zoo._common import generator, seeded


def shift(x: torch.Tensor, pixels: int, g: torch.Generator) -> torch.Tensor:
    """Each image moved by up to ``pixels`` in both directions (a random crop of the edge-padded batch)."""
    if pixels == 0:
        return x
    n, _, h, w = x.shape
    padded = F.pad(x, (pixels,) * 4, mode="replicate")
    dy, dx = (torch.randint(0, 2 * pixels + 1, (n,), generator=g) for _ in range(2))
    rows = (torch.arange(h) + dy[:, None])[:, None, :, None].expand(n, x.shape[1], h, w + 2 * pixels)
    taken = padded.gather(2, rows)
    cols = (torch.arange(w) + dx[:, None])[:, None, None, :].expand(n, x.shape[1], h, w)
    return taken.gather(3, cols)


def fit(make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int,
        lr: float, batch: int = 64, weight_decay: float = 0.0, shift_pixels: int = 0) -> nn.Module:
    """A fresh ``make()`` trained on ``(x, y)`` with cross entropy; returned in eval mode."""
    with torch_threads(1):
        return _fit(make, x, y, seed=seed, epochs=epochs, lr=lr, batch=batch, weight_decay=weight_decay,
                    shift_pixels=shift_pixels)


def _fit(make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int,
         lr: float, batch: int, weight_decay: float, shift_pixels: int) -> nn.Module:
    with seeded(seed):
        model = make()
    g = generator(seed + 1)
    opt = (torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay) if weight_decay
           else torch.optim.Adam(model.parameters(), lr=lr))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(order), batch):
            index = order[start:start + batch]
            opt.zero_grad()
            F.cross_entropy(model(shift(x[index], shift_pixels, g)), y[index]).backward()
            opt.step()
        sched.step()
    return model.eval()
