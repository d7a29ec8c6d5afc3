"""The sweep's result cache: a finished job's row on disk, keyed by what determines it.

A key is a SHA-256 of the model's fingerprint (``runner.fingerprint``: its exported graph, weights,
inputs and base quantization), the job's target, quantization fields, backend options and measures,
and qlower's version. Re-running a sweep recomputes only jobs whose key changed; an interrupted
sweep resumes, as every row is written the moment its job finishes. Failed rows are not kept (a
crash may not happen again). Rows are JSON files (no pickle) under ``$QLOWER_CACHE_DIR/sweep`` or
``~/.cache/qlower/sweep``, at most ``max_entries`` of them: the least recently used go first.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from qlower.sweep.jobs import Job

DEFAULT_MAX_ENTRIES = 20_000


def default_dir() -> Path:
    """``$QLOWER_CACHE_DIR/sweep``, else ``~/.cache/qlower/sweep`` (beside qlower's other caches)."""
    base = os.environ.get("QLOWER_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "qlower") / "sweep"


def job_key(job: Job, fingerprint: str) -> str:
    import qlower

    spec = {k: v for k, v in job.describe().items() if k not in ("model", "size", "trained")}
    text = json.dumps({"fingerprint": fingerprint, "job": spec, "qlower": qlower.__version__},
                      sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class ResultCache:
    """Rows by key in ``directory`` (default ``default_dir()``), bounded to ``max_entries`` files."""

    def __init__(self, directory: str | Path | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()
        self.max_entries = max_entries

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None   # absent, or a torn or foreign file: recomputed
        if not isinstance(row, dict) or row.get("key") != key:
            return None
        try:
            os.utime(path)   # recently used: evicted last
        except OSError:
            pass
        return row

    def put(self, key: str, row: dict[str, Any]) -> None:
        if row.get("status") == "failed":
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(row, sort_keys=True, default=repr), encoding="utf-8")
        os.replace(tmp, path)   # whole or not at all: an interrupted write leaves no torn row

    def prune(self) -> int:
        """Remove the least recently used rows beyond ``max_entries``; how many were removed."""
        files = list(self.directory.glob("*/*.json"))
        if len(files) <= self.max_entries:
            return 0
        files.sort(key=lambda p: p.stat().st_mtime)
        extra = files[:len(files) - self.max_entries]
        for path in extra:
            path.unlink(missing_ok=True)
        return len(extra)
