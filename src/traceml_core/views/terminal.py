"""``--mode cli``: the live terminal view, or status lines when stdout is not a terminal.

On a terminal, a rich ``Live`` region at the bottom shows per rank: state and staleness, step,
throughput, per-phase median times of its recent steps, peak memory and a sparkline of its
recent step times; per node: CPU, RAM and each GPU's use; and the verdict so far. Training output
scrolls above it (see :mod:`.output`). The region is rebuilt from the feed at every refresh with
ages computed at that moment, so a rank that stops sending is shown as "no data for N s" and a
silent aggregator is named, never a frozen table.

Elsewhere (an sbatch log, a pipe), :class:`LineView` prints one compact line every
``TRACEML_STATUS_INTERVAL`` seconds, plus one line at once when a rank goes stale or its
connection is lost.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional, TextIO

from .feed import LiveFeed
from .snapshot import PHASES, VERDICT_AFTER_STEPS, LiveState, RankLive

SPARK = "▁▂▃▄▅▆▇█"
MAX_ROWS = 32


# --- formatting shared by both ------------------------------------------------------------------------
def fmt_ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v / 1000:.1f}s"


def fmt_bytes(v: Optional[float]) -> str:
    if v is None or v < 0:
        return "-"
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if v >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{int(v)}B"


def fmt_elapsed(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def sparkline(values: list[float], width: int = 16) -> str:
    vals = values[-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if hi <= lo:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * len(SPARK)))] for v in vals)


def rate(r: RankLive) -> Optional[float]:
    """Steps/s now: from the last poll's counts, 0 for a rank that stopped sending."""
    if r.state in ("stale", "gone", "ended"):
        return 0.0
    if r.last_step < 0:
        return None
    return r.rate if r.rate is not None else r.steps_per_s


def verdict_so_far(st: LiveState) -> Optional[dict]:
    if st.verdict and max((r.received for r in st.ranks), default=0) >= VERDICT_AFTER_STEPS:
        return st.verdict
    return None


def _median(xs: list[float]) -> Optional[float]:
    s = sorted(xs)
    if not s:
        return None
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def status_line(st: Optional[LiveState], contact: tuple[bool, Optional[float], Optional[str]]) -> str:
    """One compact line (for logs): progress, speed, the worst rank, memory, system, staleness."""
    ok, age, err = contact
    if st is None:
        return f"[traceml] live: waiting for the aggregator{'' if err is None else f' ({err})'}"
    active = [r for r in st.ranks if r.state in ("ok", "starting")]
    timed = [r for r in active if r.ms.get("step") is not None]
    last = max((r.last_step for r in st.ranks), default=-1)
    parts = [f"[traceml] {fmt_elapsed(st.elapsed_s)}",
             f"step {last + 1}" if last >= 0 else "no step yet",
             f"ranks {len(active)}/{st.world_size} ok"]
    if timed:
        worst = max(timed, key=lambda r: r.ms["step"])
        parts.append(f"{fmt_ms(_median([r.ms['step'] for r in timed]))} ms/step "
                     f"(worst rank {worst.rank} {fmt_ms(worst.ms['step'])})")
    rates = [x for x in (rate(r) for r in st.ranks) if x is not None]
    if rates and last >= 0:
        parts.append(f"{sum(rates):.1f} steps/s")
    inputs = [r.ms.get("input") for r in active if r.ms.get("input") is not None]
    if inputs and timed:
        parts.append(f"input {fmt_ms(_median(inputs))} ms")
    mems = [r.mem_peak for r in st.ranks if r.mem_peak]
    if mems:
        parts.append(f"mem {fmt_bytes(max(mems))}")
    for n in st.nodes:
        sysp = [f"cpu {n.cpu_pct:.0f}%" if n.cpu_pct is not None else ""]
        sysp += [f"gpu{g.index} {g.util_pct:.0f}%" for g in n.gpus if g.util_pct is not None]
        text = " ".join(p for p in sysp if p)
        if text:
            parts.append(("" if st.nnodes == 1 else f"node {n.node} ") + text)
    v = verdict_so_far(st)
    if v:
        parts.append(f"so far: {v.get('kind', '').replace('_', '-')}")
    line = " | ".join(parts)
    stale = st.stale_ranks
    if stale:
        line += " | " + "; ".join(f"rank {r.rank}: {r.note}" for r in stale[:4])
        if len(stale) > 4:
            line += f"; {len(stale) - 4} more stale"
    if not ok and age is not None:
        line += f" | aggregator silent for {age:.0f} s"
    return line


# --- the rich view ------------------------------------------------------------------------------------
_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
_STATE_STYLE = {"ok": "green", "starting": "yellow", "stale": "bold red", "gone": "bold red",
                "ended": "dim", "waiting": "yellow"}


def render(st: Optional[LiveState], contact: tuple[bool, Optional[float], Optional[str]]) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ok, age, err = contact
    if st is None:
        return Text(f"TraceML live: waiting for the aggregator{'' if err is None else f' ({err})'}",
                    style="yellow")
    head = Text.assemble(("TraceML live", "bold cyan"), f"  run {st.run_name}  ·  {st.world_size} "
                         f"ranks  ·  {fmt_elapsed(st.elapsed_s)}  ·  {st.records:,} steps received")
    items: list[Any] = [head]
    if not ok and age is not None:
        items.append(Text(f"aggregator not answering for {age:.0f} s ({err}); the numbers below are "
                          f"{age:.0f} s old", style="bold red"))
    # optional columns appear once some rank measures them (h2d: CUDA; comm: a process group)
    shown = {p for p in ("h2d", "comm") if any(r.ms.get(p) is not None for r in st.ranks)}
    phases = [p for p in PHASES if p != "step" and (p not in ("h2d", "comm") or p in shown)]
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for name, justify in [("rank", "right"), ("where", "left"), ("status", "left"), ("step", "right"),
                          ("steps/s", "right"), ("step ms", "right")] + \
            [(_SHORT.get(p, p), "right") for p in phases] + \
            [("mem", "right"), ("recent steps", "left")]:
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in st.ranks[:MAX_ROWS]:
        rt = rate(r)
        where = f"{r.host or '?'}:{r.local_rank}" if r.local_rank is not None else (r.host or "-")
        t.add_row(str(r.rank), where, Text(r.short, style=_STATE_STYLE.get(r.state, "")),
                  str(r.last_step + 1 if r.last_step >= 0 else "-"),
                  "-" if rt is None else f"{rt:.1f}", fmt_ms(r.ms.get("step")),
                  *[fmt_ms(r.ms.get(p)) for p in phases], fmt_bytes(r.mem_peak),
                  sparkline(r.spark_ms))
    items.append(t)
    if len(st.ranks) > MAX_ROWS:
        items.append(Text(f"... {len(st.ranks) - MAX_ROWS} more ranks", style="dim"))
    for n in st.nodes:
        parts = [f"node {n.node} ({n.host or '?'}):"]
        if n.cpu_pct is not None:
            parts.append(f"cpu {n.cpu_pct:.0f}%")
        if n.ram_used is not None:
            parts.append(f"ram {fmt_bytes(n.ram_used)}/{fmt_bytes(n.ram_total)}")
        for g in n.gpus:
            gp = [f"gpu{g.index}", "-" if g.util_pct is None else f"{g.util_pct:.0f}%",
                  f"{fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}"]
            if g.temp_c is not None:
                gp.append(f"{g.temp_c:.0f}°C")
            if g.power_w is not None:
                gp.append(f"{g.power_w:.0f} W")
            parts.append(" ".join(gp))
        if not n.gpus:
            parts.append("no GPU samples")
        items.append(Text("  ".join(parts), style="dim"))
    for r in st.stale_ranks[:8]:
        items.append(Text(f"rank {r.rank}: {r.note}", style="bold red"))
    v = verdict_so_far(st)
    if v:
        items.append(Text.assemble(("so far: ", "bold"), (f"{v.get('kind', '').upper().replace('_', '-')}",
                                                          "bold magenta"),
                                   f" ({v.get('severity')}): {v.get('why')}"))
    return Group(*items)


class TerminalView:
    """The rich Live region plus the pump that prints training output above it."""

    def __init__(self, feed: LiveFeed, *, refresh: float = 0.5, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        from .output import OutputPump

        self.feed = feed
        self.console = console or Console()
        self.live = Live(console=self.console, get_renderable=self._renderable, auto_refresh=True,
                         refresh_per_second=max(0.2, 1.0 / refresh), transient=False,
                         redirect_stdout=True, redirect_stderr=True)
        self.pump = OutputPump(self._print)

    def _renderable(self) -> Any:
        try:
            return render(self.feed.state(), self.feed.contact())
        except Exception as exc:  # an exception here would kill rich's refresh thread: a frozen view
            from rich.text import Text
            return Text(f"TraceML live view error: {type(exc).__name__}: {exc}", style="red")

    def _print(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text.from_ansi(text.rstrip("\n")), highlight=False, soft_wrap=True)

    def popen_kwargs(self) -> dict[str, Any]:
        return self.pump.popen_kwargs()

    def start(self) -> None:
        self.live.start()

    def attach(self) -> None:
        self.pump.start()

    def stop(self) -> None:
        self.pump.join(timeout=3.0)
        try:
            self.live.refresh()
            self.live.stop()
        except Exception:
            pass


class LineView:
    """Status lines for logs: every ``interval`` s, and at once when a rank goes stale."""

    def __init__(self, feed: LiveFeed, interval: float, out: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.feed = feed
        self.interval = interval
        self.out = out
        self._clock = clock
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._flagged: set[tuple[int, str]] = set()
        self.lines = 0

    def _write(self, line: str) -> None:
        out = self.out or sys.stdout
        try:
            out.write(line + "\n")
            out.flush()
            self.lines += 1
        except (OSError, ValueError):
            pass

    def _run(self) -> None:
        next_line = self._clock() + self.interval
        while not self._stop.wait(min(1.0, self.interval)):
            try:
                st = self.feed.state()
                if st is not None:
                    for r in st.stale_ranks:
                        key = (r.rank, r.state)
                        if key not in self._flagged:
                            self._flagged.add(key)
                            self._write(f"[traceml] rank {r.rank}: {r.note}")
                if self._clock() >= next_line:
                    next_line += self.interval
                    self._write(status_line(st, self.feed.contact()))
            except Exception:  # never let the status line take anything down
                continue

    def popen_kwargs(self) -> dict[str, Any]:
        return {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="traceml-status-lines", daemon=True)
        self._thread.start()

    def attach(self) -> None:
        pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
