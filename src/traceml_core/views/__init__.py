"""Live views of a running job: ``--mode cli`` (terminal) and ``--mode dashboard`` (web page).

The launcher's hook is two calls (see launcher/run.py)::

    view = start_view(config, telemetry.snapshot)   # None unless --mode cli|dashboard on node 0
    sup = Supervisor(cmd, env, ..., **(view.popen_kwargs() if view else {}))
    sup.start(); view.attach() if view else None
    ... training ...
    view.stop() if view else None                    # before the final summary is printed

Everything runs in the launcher process on node 0: one :class:`~.feed.LiveFeed` thread asks the
aggregator for ``snapshot`` frames over the launcher's control connection, and the views render
from the feed. The aggregator's loop only answers those requests (cheap, bounded), and serves no
HTTP itself, so no browser can slow telemetry ingestion. Multi-node runs never get here: the
resolver refuses ``--mode cli|dashboard`` when ``nnodes > 1`` (config.py), because node 0 cannot
show the other nodes' training output and a per-rank table of hundreds of ranks is no live view.

A view never stops training: :func:`start_view` logs a warning and returns None when it cannot
start, and every view thread catches its own errors.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from .feed import Fetch, LiveFeed


class ViewHandle:
    """A feed plus one view (terminal, status lines or dashboard)."""

    def __init__(self, feed: LiveFeed, view: Any) -> None:
        self.feed = feed
        self.view = view

    def popen_kwargs(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments for the training command (stdout/stderr)."""
        return self.view.popen_kwargs()

    def attach(self) -> None:
        """Call right after the training command started."""
        try:
            self.view.attach()
        except Exception as exc:
            _log(f"warning: live view: {exc}")

    def stop(self) -> None:
        """Call when training ended, before the final summary is printed; never raises."""
        try:
            self.feed.stop(final_poll=True)
        except Exception:
            pass
        try:
            self.view.stop()
        except Exception:
            pass


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"[traceml] {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def is_terminal(stream: Any) -> bool:
    import os

    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def start_view(config: Any, fetch: Fetch, *, log: Callable[[str], None] = _log) -> Optional[ViewHandle]:
    """Start the live view that ``config.mode`` asks for (node 0 only); never raises."""
    if getattr(config, "mode", "summary") not in ("cli", "dashboard") or getattr(config, "node_rank", 0) != 0:
        return None
    try:
        # the view's settings are launch options (--status-interval, TRACEML_STATUS_INTERVAL, ...),
        # validated with every other value before anything started
        if config.mode == "dashboard":
            from .dashboard import Dashboard, token_exposure

            feed = LiveFeed(fetch, interval=1.0, series=True).start()
            dash = Dashboard(feed, host=config.dashboard_host, port=config.dashboard_port,
                             preferred_port=int(config.aggregator_port) + 1)
            dash.start()
            for line in dash.announce(token_exposure(2, str(getattr(config, "cluster", "") or ""))):
                log(line)
            return ViewHandle(feed, dash)
        if is_terminal(sys.stdout):
            from .terminal import TerminalView

            feed = LiveFeed(fetch, interval=config.live_refresh).start()
            view: Any = TerminalView(feed, refresh=config.live_refresh)
        else:
            from .terminal import LineView

            feed = LiveFeed(fetch, interval=min(2.0, config.status_interval)).start()
            view = LineView(feed, config.status_interval)
            log(f"live status every {config.status_interval:g} s (stdout is not a terminal; "
                "--status-interval or TRACEML_STATUS_INTERVAL sets it)")
        view.start()
        return ViewHandle(feed, view)
    except Exception as exc:
        log(f"warning: the live view could not start ({type(exc).__name__}: {exc}); training goes "
            "on and the summary is printed at the end")
        return None


__all__ = ["start_view", "ViewHandle", "LiveFeed"]
