"""Where a sweep's jobs run: each in its own local process, or as Ray tasks on a cluster.

An executor maps one picklable function over picklable items and yields an ``Outcome`` per item as it
finishes, in completion order. It never raises for what a job does: an exception, a native crash
(SIGSEGV), a killed or out-of-memory worker all become a failed ``Outcome`` with its reason, and the
other jobs go on.

* ``LocalExecutor`` — a ``concurrent.futures`` thread pool over the cores, each thread starting one
  process per job and waiting for its answer on a pipe: a process that dies without answering is a
  failed job (its signal named), not a broken pool. Processes come from a ``forkserver`` (``spawn``
  where there is none): forking a parent whose torch thread pools are running is unsafe, while the
  fork server's clean process imports torch and qlower once, so a job starts in milliseconds.
* ``RayExecutor`` — the same function as Ray tasks (``pip install 'qlower[ray]'``): a worker lost
  mid-task (a crash, a node gone) is retried ``retries`` times by Ray, then reported; a job's
  ``resources`` are its task's hints (``num_cpus``, ``memory`` in bytes, ``num_gpus``, custom ones).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from qlower.errors import ConfigError

# modules the fork server imports once, so that every job forked from it starts with them loaded
PRELOAD = ["torch", "qlower.api", "qlower.frontend.capture", "qlower.passes", "qlower.partition", "qlower.runtime",
           "qlower.verification", "qlower.zoo", "qlower.sweep.runner"]


@dataclass(frozen=True)
class Outcome:
    """What became of one item: ``value`` when ``ok``, else ``error`` (one line: what failed and why)."""

    index: int
    ok: bool
    value: Any = None
    error: str = ""
    attempts: int = 1


def describe_exception(e: BaseException) -> str:
    """``Type: message`` on one line, with the innermost frame of qlower or the user's code."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:600]}{where}"


def _child(conn, fn: Callable, item: Any, threads: int | None) -> None:
    """A job's process: run ``fn(item)`` and send back ``(True, value)`` or ``(False, reason)``."""
    try:
        if threads:
            import torch

            torch.set_num_threads(threads)
        result = (True, fn(item))
    except BaseException as e:  # noqa: BLE001  (everything a job raises is its row's reason)
        result = (False, describe_exception(e))
    try:
        try:
            conn.send(result)
        except (BrokenPipeError, ConnectionError):
            return   # the sweep is gone (interrupted): nobody to answer
        except Exception as e:  # noqa: BLE001  (an unpicklable result)
            conn.send((False, f"the job's result could not be sent back: {describe_exception(e)}"))
    except (BrokenPipeError, ConnectionError):
        return
    finally:
        conn.close()


def death_reason(exitcode: int | None) -> str:
    """Why a job's process ended without an answer, from its exit code (negative: the signal)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {"SIGKILL": " (killed: out of memory, or by hand)", "SIGSEGV": " (a native crash)",
                "SIGABRT": " (a native abort)", "SIGBUS": " (a native crash)"}.get(name, "")
        return f"the job's process died from {name}{hint}"
    return f"the job's process exited with code {exitcode} without a result"


_CONTEXTS: dict[str, Any] = {}
_CONTEXT_LOCK = threading.Lock()


def process_context(method: str | None = None):
    """The multiprocessing context jobs start from: ``forkserver`` (preloading qlower's job runner) where
    the platform has it, else ``spawn``. Never ``fork``: torch's thread pools don't survive it."""
    methods = multiprocessing.get_all_start_methods()
    method = method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in ("forkserver", "spawn") or method not in methods:
        raise ConfigError(f"a sweep starts its processes with 'forkserver' or 'spawn' (this platform has "
                          f"{', '.join(m for m in methods if m != 'fork')}); got {method!r}")
    with _CONTEXT_LOCK:
        if method not in _CONTEXTS:
            ctx = multiprocessing.get_context(method)
            if method == "forkserver":
                ctx.set_forkserver_preload(PRELOAD)
            _CONTEXTS[method] = ctx
        return _CONTEXTS[method]


@dataclass
class LocalExecutor:
    """Jobs in processes of this machine, ``workers`` at a time (default: the cores), each job alone in
    its process. ``timeout``: seconds after which a job's process is killed and the job failed.
    ``threads``: torch's intra-op threads in each job (default: the cores shared among the workers)."""

    workers: int | None = None
    timeout: float | None = None
    threads: int | None = None
    start_method: str | None = None
    name: str = field(default="local", init=False)

    def __post_init__(self) -> None:
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"workers is how many jobs run at once, an integer >= 1; got {self.workers!r}")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"timeout is seconds per job (> 0) or None; got {self.timeout!r}")

    @property
    def size(self) -> int:
        return self.workers or os.cpu_count() or 1

    def _one(self, fn: Callable, index: int, item: Any, stop: threading.Event) -> Outcome:
        ctx = process_context(self.start_method)
        threads = self.threads or max(1, (os.cpu_count() or 1) // self.size)
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, fn, item, threads), daemon=True)
        proc.start()
        send.close()
        waited = 0.0
        try:
            while not receive.poll(0.2):   # a dead process closes its end: poll returns True, recv raises
                waited += 0.2
                if stop.is_set():
                    return Outcome(index, False, error="the sweep was interrupted")
                if self.timeout is not None and waited >= self.timeout:
                    return Outcome(index, False, error=f"timed out after {self.timeout:g} s (the job's process was killed)")
            try:
                ok, value = receive.recv()
            except (EOFError, OSError):
                proc.join(5)
                return Outcome(index, False, error=death_reason(proc.exitcode))
            return Outcome(index, True, value) if ok else Outcome(index, False, error=value)
        finally:
            receive.close()
            if proc.is_alive():
                proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def map(self, fn: Callable, items: Sequence[Any]) -> Iterator[Outcome]:
        """``fn`` over ``items``, an ``Outcome`` each as it finishes. Closing the iterator early (or
        Ctrl-C) kills the jobs still running."""
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=min(self.size, max(1, len(items))),
                                thread_name_prefix="qlower-sweep") as pool:
            pending = {pool.submit(self._one, fn, i, item, stop) for i, item in enumerate(items)}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield future.result()
            finally:
                stop.set()
                for future in pending:
                    future.cancel()


@dataclass
class RayExecutor:
    """Jobs as Ray tasks: on the cluster at ``address`` (``"auto"``: the one this machine belongs to;
    None: the one already initialised in this process, else a local one). A task whose worker dies is
    retried ``retries`` times, then failed with Ray's reason; an exception inside a job is not retried
    (it would fail the same way). ``resources(item)`` gives an item's task hints (default: its job's
    ``resources``, else 1 CPU)."""

    address: str | None = None
    retries: int = 2
    resources: Callable[[Any], Mapping[str, Any]] | None = None
    name: str = field(default="ray", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"retries is how often Ray re-runs a job whose worker died, an integer >= 0; "
                              f"got {self.retries!r}")

    @staticmethod
    def ray():
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray needs Ray: pip install 'qlower[ray]'") from None
        return ray

    def _connect(self):
        ray = self.ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("QLOWER_")}})
        return ray

    @property
    def size(self) -> int:
        ray = self._connect()
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable, items: Sequence[Any]) -> Iterator[Outcome]:
        ray = self._connect()
        task = ray.remote(_ray_call)
        refs = {}
        for i, item in enumerate(items):
            hints = dict(self.resources(item) if self.resources else job_resources(item))
            options = {"num_cpus": hints.pop("num_cpus", 1), "max_retries": self.retries, "retry_exceptions": False}
            for key in ("memory", "num_gpus"):
                if key in hints:
                    options[key] = hints.pop(key)
            if hints:
                options["resources"] = hints
            refs[task.options(**options).remote(fn, item)] = i
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    index = refs[ref]
                    try:
                        ok, value = ray.get(ref)
                    except ray.exceptions.WorkerCrashedError:
                        yield Outcome(index, False, error=f"the job's Ray worker died {self.retries + 1} time(s) "
                                                          "(a native crash or out of memory; retried by Ray)",
                                      attempts=self.retries + 1)
                        continue
                    except ray.exceptions.RayError as e:
                        yield Outcome(index, False, error=f"Ray could not run the job: {describe_exception(e)}")
                        continue
                    yield Outcome(index, True, value) if ok else Outcome(index, False, error=value)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


def job_resources(item: Any) -> dict[str, Any]:
    """A sweep item's resource hints: its job's ``resources`` (an item is a job, or a tuple led by one)."""
    from qlower.sweep.jobs import Job

    job = item[0] if isinstance(item, tuple) and item else item
    return dict(job.resources) if isinstance(job, Job) else {}


def _ray_call(fn: Callable, item: Any) -> tuple[bool, Any]:
    """A Ray task: ``fn(item)``, its exception as a failed result (only lost workers are retried)."""
    try:
        return True, fn(item)
    except Exception as e:  # noqa: BLE001
        return False, describe_exception(e)


def make_executor(executor: Any = None, *, workers: int | None = None, ray: str | bool | None = None):
    """An executor from the sweep's arguments: one given as it is; ``ray`` (True or an address) a
    ``RayExecutor``; else a ``LocalExecutor`` of ``workers`` processes."""
    if executor is not None:
        if not hasattr(executor, "map"):
            raise ConfigError(f"executor must be a LocalExecutor or RayExecutor, got {type(executor).__name__}")
        return executor
    if ray:
        return RayExecutor(address=None if ray is True else str(ray))
    return LocalExecutor(workers=workers)


_CURRENT: Any = None


class use_executor:  # noqa: N801  (used as a function: ``with use_executor(LocalExecutor(2)):``)
    """Within the ``with`` block, qlower's own fan-outs (``qlower.sensitivity``, ``auto_int16``) run their
    per-layer measurements through ``executor`` instead of in series in this process."""

    def __init__(self, executor: Any) -> None:
        if executor is not None and not hasattr(executor, "map"):
            raise ConfigError(f"use_executor takes a LocalExecutor or RayExecutor, got {type(executor).__name__}")
        self.executor = executor

    def __enter__(self) -> Any:
        global _CURRENT
        self.previous, _CURRENT = _CURRENT, self.executor
        return self.executor

    def __exit__(self, *exc: object) -> None:
        global _CURRENT
        _CURRENT = self.previous


def current_executor() -> Any:
    """The executor ``use_executor`` set (None: run in this process)."""
    return _CURRENT
