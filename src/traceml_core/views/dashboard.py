"""``--mode dashboard``: a local web page with live charts, served from node 0's launcher.

The stack is deliberately small: the standard library's ``ThreadingHTTPServer`` in a daemon
thread, one HTML page (``static/dashboard.html``) with uPlot (``static/uPlot.*``, 50 KB, MIT,
vendored from npm ``uplot@1.6.32``) inlined into it, and a JSON endpoint the page polls once a
second. Nothing is fetched from the internet at runtime, nothing needs installing beyond
traceml itself (the ``dashboard`` extra is empty on purpose), and it starts in milliseconds.

Security: it binds to 127.0.0.1 unless ``TRACEML_DASHBOARD_HOST`` says otherwise, and every
request must carry the run's dashboard token (``?token=...``, 128 random bits, a different secret
from the aggregator's run token, compared in constant time); anything else gets 403. Users reach
it through an ssh tunnel (the launcher prints the command). Responses are ``no-store`` with a
strict Content-Security-Policy and no referrer, so the token does not leak into caches or other
sites.

Routes: ``/`` (the page), ``/api/live`` (the current :class:`~.snapshot.LiveState`, per-rank
whole-run series and the feed's history, as JSON).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import stat
import threading
from dataclasses import asdict, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

from ..assets import STATIC, chart_assets, fill
from .feed import LiveFeed
from .terminal import rate, verdict_so_far

_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page_html() -> str:
    """The page with uPlot and our chart helpers inlined (one request, no second route to protect)."""
    return fill((STATIC / "dashboard.html").read_text(encoding="utf-8"), chart_assets())


def live_json(feed: LiveFeed) -> dict[str, Any]:
    st = feed.state()
    ok, age, err = feed.contact()
    out: dict[str, Any] = {"updates": feed.updates, "aggregator": {"ok": ok, "age_s": age, "error": err},
                           "history": feed.history(), "state": None, "series": []}
    if st is None:
        return out
    ranks = []
    for r in st.ranks:  # the page reads the recent numbers (ms, mem_peak) as the rank's
        ranks.append({**asdict(replace(r, series=None)), **asdict(r.recent), "stale": r.stale, "short": r.short,
                      "rate_now": rate(r)})
        s = r.series
        if s:
            w = s.width
            out["series"].append({
                "rank": r.rank,
                "x": [i * w + (w - 1) / 2 for i in range(len(s.step_ms))],
                "step_ms": s.step_ms, "own_ms": s.own_ms, "phases_ms": s.phases_ms,
                "mem_mib": [None if m is None else round(m / 1048576, 1) for m in s.mem_max]})
    out["state"] = {**asdict(replace(st, ranks=[])), "ranks": ranks,
                    "verdict": asdict(v) if (v := verdict_so_far(st)) else None}
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    token = ""
    feed: Optional[LiveFeed] = None
    page = ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "traceml-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # no access log on the training terminal
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", _CSP)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorised(self, query: str) -> bool:
        given = (parse_qs(query).get("token") or [""])[0]
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.server.token.encode())

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlsplit(self.path)
        if not self._authorised(url.query):
            self._send(403, b"403 Forbidden: this TraceML dashboard needs the run's token in the URL "
                            b"(?token=...), exactly as `traceml run` printed it.\n", "text/plain; charset=utf-8")
            return
        try:
            if url.path in ("/", "/index.html"):
                self._send(200, self.server.page.encode(), "text/html; charset=utf-8")
            elif url.path == "/api/live":
                assert self.server.feed is not None
                body = json.dumps(live_json(self.server.feed), allow_nan=False, default=str).encode()
                self._send(200, body, "application/json")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        self._send(405, b"read-only\n", "text/plain; charset=utf-8")


def token_exposure(fd: int = 2, cluster: str = "") -> Optional[str]:
    """Why the launcher's log (``fd``) may be read by others, or None when only this user can:
    a terminal, or a file of this user's that nobody else may read (mode 0600). A regular file
    readable by others is named with its mode; under a cluster (``cluster``, e.g. ``slurm``) the
    output is a pipe to the job's output file, which Slurm creates with the user's umask (usually
    readable by everyone). A pipe outside a cluster is the user's own (``| tee``, a test)."""
    try:
        if os.isatty(fd):
            return None
        st = os.fstat(fd)
    except OSError:
        return "the log's destination could not be checked"
    if stat.S_ISREG(st.st_mode):
        if st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return None
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = "the log file"
        return (f"{name} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}; `chmod 600` it, or "
                "set `umask 077` before the run, to see the token here)")
    if cluster and cluster != "none":
        return ("the log goes to the job's output file, which the scheduler creates readable by others "
                "unless your umask says otherwise")
    return None


def write_private_url(dash: "Dashboard") -> tuple[Optional[str], Optional[str]]:
    """The dashboard's address with its token in ``dashboard-<port>.url`` of a directory only
    this user can use (``$TMPDIR/traceml-<uid>``, else a fresh one: rundir.make_private; the
    file 0600, never through a symlink): (its path, why the usual directory was not used), or
    (None, why none could be written)."""
    from ..rundir import make_private

    try:
        where, note = make_private()
        path = where / f"dashboard-{dash.port}.url"
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(dash.url + "\n")
        return str(path), note
    except OSError as exc:
        return None, exc.strerror or str(exc)


class Dashboard:
    def __init__(self, feed: LiveFeed, *, host: str = "127.0.0.1", port: int = 0,
                 preferred_port: Optional[int] = None, token: Optional[str] = None) -> None:
        self.feed = feed
        self.host = host
        self.token = token or secrets.token_urlsafe(16)
        ports = [port] if port else ([preferred_port] if preferred_port and preferred_port < 65536 else []) + [0]
        last: Optional[OSError] = None
        self.httpd: Optional[_Server] = None
        for p in ports:
            try:
                self.httpd = _Server((host, p), _Handler)
                break
            except OSError as exc:
                last = exc
        if self.httpd is None:
            raise OSError(f"cannot listen on {host}:{port or preferred_port}: {last}")
        self.httpd.token = self.token
        self.httpd.feed = feed
        self.httpd.page = page_html()
        self.port = self.httpd.server_address[1]
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    def announce(self, exposed: Optional[str] = None) -> list[str]:
        """The log lines that say where the dashboard is. ``exposed``: why the log may be read by
        others (:func:`token_exposure`); then the token goes to a file only this user can read
        (:func:`write_private_url`), and the lines say where."""
        node = socket.gethostname()
        secret = f"?token={self.token}"
        lines = [f"dashboard: {self.url}"]
        if exposed is not None:
            where, note = write_private_url(self)
            if where is None:  # no private file could be made: the log is the only place left
                lines = [f"dashboard: {self.url} (warning: this log may be read by others, {exposed}; "
                         f"the token is printed here because no private file could be written: {note})"]
            else:
                secret = ""
                lines = [f"dashboard: {self.url.split('?', 1)[0]} (the address with its access token is in "
                         f"{where}, readable only by you; it is not printed here because {exposed})"]
                if note:
                    lines.append(f"  note: {note}")
        if self.host in ("127.0.0.1", "::1", "localhost"):
            lines.append(f"  from your laptop: ssh -L {self.port}:127.0.0.1:{self.port} {node}  "
                         f"(add -J <login-node> if {node} is only reachable through it), then open "
                         f"http://localhost:{self.port}/{secret}"
                         + (" with the token from that file" if exposed is not None else ""))
        else:
            lines.append(f"  warning: listening on {self.host}, not only on this node: the token in "
                         "the URL is the only protection")
        return lines

    def popen_kwargs(self) -> dict[str, Any]:
        return {}

    def start(self) -> None:
        assert self.httpd is not None
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="traceml-dashboard", daemon=True)
        self._thread.start()

    def attach(self) -> None:
        pass

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
