"""A tiny client for a headless Chromium over the DevTools protocol, for the trace page's test.

Chromium is started with --remote-debugging-pipe: it reads JSON commands on file descriptor 3 and
writes replies and events on descriptor 4, each message ending in a NUL byte. No websocket, no
package beyond the standard library.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """with Browser() as b: b.open(url); b.evaluate("1 + 1"); b.screenshot() -> PNG bytes."""

    def __init__(self, executable: str | None = None, width: int = 1100, height: int = 900,
                 timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise FileNotFoundError("no chromium found (apt-get install chromium)")
        self.width, self.height, self.timeout = width, height, timeout
        self.events: list[dict] = []
        self._next_id = 0
        self._buffer = b""

    def __enter__(self):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_fds():  # in the child: its fd 3 reads our commands, fd 4 carries its replies
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)  # (in case either is 3 or 4)
            os.dup2(r, 3)  # dup2 makes them inheritable; every other pipe end closes at exec
            os.dup2(w, 4)

        self.process = subprocess.Popen(
            [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             "--hide-scrollbars", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=self.width,
                  height=self.height, deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the protocol ----------------------------------------------------------------------------

    def send(self, method: str, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise ConnectionError("chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for_event(self, method: str) -> dict:
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read())

    # -- what the test uses ------------------------------------------------------------------------

    def open(self, url: str) -> None:
        self.send("Page.navigate", session=True, url=url)
        self.wait_for_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        self.send("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", session=True, format="png")["data"])

    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(str(params["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", ""))
        return found
