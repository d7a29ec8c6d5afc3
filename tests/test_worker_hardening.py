"""Worker processes: a timeout on every call, a process group of their own, and a worker killed
from outside named as such (issue 30)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from qlower.backends import workers
from qlower.backends.workers import WorkerDied, WorkerKilled, WorkerPool, WorkerTimeout
from qlower.errors import ConfigError, ExecutionError

BACKENDS = Path(workers.__file__).resolve().parent

SCRIPT = textwrap.dedent(f"""
    import os, signal, sys, time
    sys.path.append({str(BACKENDS)!r})
    from frames import private_pipes, serve

    # a test suite started as a background job inherits SIGINT ignored, and so would this worker
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def handle(frame):
        if frame[0] == b"sleep":
            time.sleep(float(frame[1]))
        if frame[0] == b"segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        return [b"ok", str(os.getpid()).encode()]

    serve(*private_pipes(), handle)
""")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "sleepy_worker.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def pool(script: Path):
    p = WorkerPool(script, limit=lambda: 1)
    yield p
    p.close()


def test_a_call_that_takes_too_long_is_stopped_and_the_next_works(pool):
    start = time.monotonic()
    with pytest.raises(WorkerTimeout, match="did not answer within 0.5 s"):
        pool.call([b"sleep", b"60"], timeout=0.5)
    assert time.monotonic() - start < 10
    assert pool.call([b"echo"], timeout=30)[0] == b"ok"


def test_the_timeout_is_configurable(pool, monkeypatch):
    monkeypatch.setenv(workers.TIMEOUT_ENV, "0.3")
    with pytest.raises(WorkerTimeout):
        pool.call([b"sleep", b"60"])
    assert pool.call([b"sleep", b"0.01"], timeout=30)[0] == b"ok"
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(workers.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=workers.TIMEOUT_ENV):
            workers.worker_timeout()
    monkeypatch.delenv(workers.TIMEOUT_ENV)
    assert workers.worker_timeout() == workers.DEFAULT_TIMEOUT >= 600


def test_workers_have_their_own_process_group(pool):
    pid = int(pool.call([b"echo"])[1])
    assert os.getpgid(pid) == pid != os.getpgrp()


def test_an_idle_worker_killed_from_outside_is_replaced(pool):
    pid = int(pool.call([b"echo"])[1])
    os.kill(pid, signal.SIGINT)
    time.sleep(0.5)
    answer = pool.call([b"echo"], timeout=30)
    assert answer[0] == b"ok" and int(answer[1]) != pid


def test_a_worker_killed_while_working_says_so_and_a_crash_says_how(pool):
    pid = int(pool.call([b"echo"])[1])
    errors: list[BaseException] = []

    def work():
        try:
            pool.call([b"sleep", b"60"], timeout=60)
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], WorkerKilled) and isinstance(errors[0], ExecutionError)
    assert "killed by SIGKILL from outside" in str(errors[0])
    with pytest.raises(WorkerDied, match="SIGSEGV"):
        pool.call([b"segfault"], timeout=30)
    assert pool.call([b"echo"], timeout=30)[0] == b"ok"


def test_a_terminal_ctrl_c_does_not_reach_idle_workers(script, tmp_path):
    """A process group like a terminal's: the caller ignores SIGINT, sends it to its group, and its
    idle worker still answers (same process)."""
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(BACKENDS.parent.parent)!r})
        from pathlib import Path
        from qlower.backends.workers import WorkerPool
        pool = WorkerPool(Path({str(script)!r}), limit=lambda: 1)
        first = pool.call([b"echo"])[1]
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGINT)
        time.sleep(0.5)
        print(first == pool.call([b"echo"])[1])
        pool.close()
    """))
    out = subprocess.run([sys.executable, str(caller)], capture_output=True, text=True, timeout=120,
                         start_new_session=True)
    assert out.stdout.strip() == "True", out.stderr
