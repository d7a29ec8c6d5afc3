"""Headless Chromium driven over the DevTools protocol on a pipe (no extra packages).

Pages that draw after they load (Model Explorer lays out and paints its graph in WebGL when its
data arrives) can't be judged by ``--dump-dom`` or ``--screenshot``, which act at the load event.
``--remote-debugging-pipe`` gives the protocol on file descriptors 3 (to Chromium) and 4 (from
it), one JSON message per NUL-terminated frame: enough to wait for a condition, read the page
and take a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
         "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--remote-debugging-pipe")


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are both above 9 (close-on-exec, as every fd Python makes)."""
    import fcntl

    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


class BrowserError(RuntimeError):
    """Chromium is missing, exited, or a page did not reach the awaited state in time."""


class Chromium:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, width: int = 1400, height: int = 900, timeout: float = 120.0):
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            raise BrowserError("Chromium is needed (scripts/setup_browser.sh installs Debian's chromium)")
        self.timeout = timeout
        # a renderer still exiting may write to the profile while it is removed: a leftover temp
        # directory is harmless, an error there would fail a test that passed
        self._profile = tempfile.TemporaryDirectory(prefix="qlower-chromium-", ignore_cleanup_errors=True)
        to_browser_r, self._to_browser = _high_pipe()
        self._from_browser, from_browser_w = _high_pipe()
        # the child sees its ends as fds 3 and 4, as --remote-debugging-pipe expects (moved there by
        # the shell; both ends sit above 9, so neither redirection overwrites the other)
        self._proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} '
                              f'{to_browser_r}<&- {from_browser_w}>&-',
             binary, *FLAGS, f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(to_browser_r, from_browser_w), start_new_session=True)  # its own group: close() kills all
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._session = ""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        try:   # the browser and its renderer / GPU / zygote children, not the browser alone
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait(timeout=30)
        self._profile.cleanup()

    # -- the protocol -----------------------------------------------------------------
    def call(self, method: str, **params: Any) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self._session and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self._proc.poll()})")
            self._buffer += chunk
        frame, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(frame)

    # -- a page -------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None, interval: float = 0.5) -> Any:
        """Poll ``expression`` until it is truthy; returns its value. An expression that throws
        (the page is still loading: no body yet) counts as not yet."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        last = ""
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError as e:
                value, last = None, f" (last: {e})"
            if value:
                return value
            time.sleep(interval)
        raise BrowserError(f"the page never satisfied {expression!r}{last}")

    def screenshot(self, path: str | os.PathLike) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
