"""Drive headless Chromium (Debian's ``chromium`` package) over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes the browser read NUL-terminated JSON commands from fd 3 and
write replies and events to fd 4: no port, no websocket library, nothing but the standard
library. Used by the dashboard's and the HTML report's browser tests.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--mute-audio"]
OFFLINE_FLAGS = ["--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                 "--host-resolver-rules=MAP * ~NOTFOUND"]


def chromium_path() -> Optional[str]:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


class CDPError(Exception):
    pass


class Chromium:
    def __init__(self, user_data_dir: Path, *, width: int = 1400, height: int = 1100,
                 offline: bool = False) -> None:
        """``offline``: every request the page makes goes to a proxy that does not exist (port 9
        of loopback, nothing listens there), so a page that needed the network would fail."""
        exe = chromium_path()
        if exe is None:
            raise CDPError("chromium is not installed (apt-get install chromium)")
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        # move the child's ends out of the way of fds 3 and 4 before dup2 puts them there
        hi_cmd_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 100)
        hi_out_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 100)
        os.close(cmd_r)
        os.close(out_w)

        def child_fds() -> None:
            os.dup2(hi_cmd_r, 3)
            os.dup2(hi_out_w, 4)

        self.log = open(Path(user_data_dir).with_suffix(".log"), "wb")
        self.proc = subprocess.Popen(
            [exe, *FLAGS, *(OFFLINE_FLAGS if offline else []), f"--user-data-dir={user_data_dir}",
             "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log)
        os.close(hi_cmd_r)
        os.close(hi_out_w)
        self._w = cmd_w
        self._r = out_r
        self._id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: Optional[str] = None

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self._r, 65536)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self._cond.notify_all()
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()

    def send(self, method: str, params: Optional[dict[str, Any]] = None, *, session: bool = True,
             timeout: float = 20.0) -> dict[str, Any]:
        self._id += 1
        mid = self._id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        with self._cond:
            ok = self._cond.wait_for(lambda: mid in self._replies or self.proc.poll() is not None, timeout)
            if not ok or mid not in self._replies:
                raise CDPError(f"no reply to {method} within {timeout} s")
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", {"url": url})

    def eval(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise CDPError(f"JS exception: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.2) -> Any:
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            try:
                last = self.eval(expression)
            except CDPError:
                last = None
            if last:
                return last
            time.sleep(interval)
        raise CDPError(f"timed out waiting for {expression!r} (last value {last!r})")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5.0)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
