"""A real browser for the HTML report tests: headless chromium driven over
the DevTools protocol on a pipe (``--remote-debugging-pipe``: fd 3 carries
commands to the browser, fd 4 its answers and events, each message JSON
ended by a NUL byte). Standard library only.

``render(page, png)`` opens the file, records every network request and
every console message, error or exception, takes a full-page screenshot and
returns the text a reader sees (``document.body.innerText``).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)


@dataclass
class Rendered:
    text: str  # what a reader sees
    height: int  # the page's full height (CSS pixels)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    console: list[str] = field(default_factory=list)  # console messages, errors, exceptions
    seconds: float = 0.0  # open + load + screenshot


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)


def render(page: Path | str, png: Path, width: int = 1200, from_id: str | None = None,
           height: int | None = None) -> Rendered:
    """Open ``page`` (a file, or an http:// URL) in headless chromium; screenshot the
    whole page to ``png`` (or ``height`` pixels of it, from the element ``from_id``)."""
    started = time.monotonic()
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="mlxcluster-chromium-")
    # The child sees our read end of the command pipe as fd 3 and the write end of the
    # answer pipe as fd 4, as --remote-debugging-pipe expects.
    # (copied above 9 first, so that neither dup2 overwrites the other pipe's end).
    def child_fds():
        high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(3, 4), preexec_fn=child_fds)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(proc, to_browser_w, from_browser_r)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        pipe.events.clear()  # what about:blank did is not the page's
        url = page if isinstance(page, str) else page.resolve().as_uri()
        pipe.call("Page.navigate", {"url": url}, session=session)
        pipe.wait_for("Page.loadEventFired")

        def evaluate(expression: str):
            return pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                             session=session)["result"]["value"]

        height_all = int(evaluate("document.documentElement.scrollHeight"))
        text = evaluate("document.body.innerText")
        top = int(evaluate(f"document.getElementById({json.dumps(from_id)}).offsetTop")) - 16 \
            if from_id else 0
        shot = pipe.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": top, "width": width,
                     "height": min(height or height_all, height_all - top), "scale": 1}},
            session=session, timeout=60)
        png.write_bytes(base64.b64decode(shot["data"]))
        result = Rendered(text, height_all, seconds=time.monotonic() - started)
        for event in pipe.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                result.console.append(f"console.{params.get('type')}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                result.console.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                result.console.append(f"{entry.get('level')}: {entry.get('text')} {entry.get('url', '')}")
        try:
            pipe.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
        return result
    finally:
        os.close(to_browser_w)
        os.close(from_browser_r)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":  # docs/ screenshots: python -m tests.browser PAGE PNG [ID|- HEIGHT]
    import sys

    args = sys.argv[1:]
    shown = render(Path(args[0]), Path(args[1]), from_id=args[2] if len(args) > 2 and args[2] != "-" else None,
                   height=int(args[3]) if len(args) > 3 else None)
    print(f"{args[1]}: page {shown.height} px tall, rendered in {shown.seconds:.1f} s; "
          f"requests {shown.requests}; console {shown.console}")
