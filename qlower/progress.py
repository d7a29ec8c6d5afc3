"""Progress bars: on where a user waits at a terminal, off in logs and pipes.

A bar redraws itself with carriage returns; written to a file or a CI log those frames pile up
as noise, so a bar is shown only when asked for *and* stderr is a terminal.
"""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


def progress_bar(show: bool, **kwargs: Any) -> tqdm:
    """A tqdm bar (``kwargs`` as tqdm's) when ``show`` and stderr is a terminal; a silent one otherwise."""
    return tqdm(disable=None if show else True, **kwargs)   # tqdm: None means "off unless a TTY"
