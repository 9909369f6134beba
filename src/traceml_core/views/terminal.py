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
from statistics import median
from typing import Any, Callable, Optional, TextIO

from ..livesnapshot import LiveVerdict
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
    return r.rate if r.rate is not None else r.recent.steps_per_s


def verdict_so_far(st: LiveState) -> Optional[LiveVerdict]:
    if st.verdict and max((r.received for r in st.ranks), default=0) >= VERDICT_AFTER_STEPS:
        return st.verdict
    return None


def ranks_phrase(st: LiveState) -> str:
    """How the ranks stand, every rank counted once: ``ranks 2/2 running``, ``ranks 2/2 ended
    clean``, ``ranks 1/2 running, 1 lost``."""
    groups: dict[str, int] = {}
    for r in st.ranks:
        if r.state in ("ok", "starting"):
            key = "running"
        elif r.state == "ended":
            key = f"ended {r.bye}" if r.bye else "ended"
        elif r.state == "gone":
            key = "lost"
        else:
            key = r.state
        groups[key] = groups.get(key, 0) + 1
    if not groups:
        return f"ranks 0/{st.world_size}"
    items = sorted(groups.items(), key=lambda kv: -kv[1])
    first, n = items[0]
    rest = "".join(f", {n2} {k2}" for k2, n2 in items[1:])
    return f"ranks {n}/{st.world_size} {first}{rest}"


def status_line(st: Optional[LiveState], contact: tuple[bool, Optional[float], Optional[str]],
                prev_step: Optional[int] = None, since_s: Optional[float] = None) -> str:
    """One compact line (for logs): progress, per-rank speed, the worst rank, memory, system,
    staleness. Rates and times are per rank (medians over the ranks), never summed.
    ``prev_step``/``since_s``: the step count of the previous line and the seconds since it, so a
    line with no progress says so instead of repeating the count as if it were news."""
    ok, age, err = contact
    if st is None:
        return f"[traceml] live: waiting for the aggregator{'' if err is None else f' ({err})'}"
    active = [r for r in st.ranks if r.state in ("ok", "starting")]
    timed = [r for r in active if r.recent.ms.get("step") is not None]
    last = max((r.last_step for r in st.ranks), default=-1)
    if last < 0:
        progress = "no step yet"
    elif prev_step is not None and last + 1 == prev_step and since_s is not None:
        progress = f"step {last + 1} (no new step in {since_s:.0f} s)"
    else:
        progress = f"step {last + 1}"
    parts = [f"[traceml] {fmt_elapsed(st.elapsed_s)}", progress, ranks_phrase(st)]
    if timed:
        worst = max(timed, key=lambda r: r.recent.ms["step"])
        # the median step as the summary defines it (every step of every rank), over the recent
        # steps each rank reported; a rank's own recent median only when none came with them
        pooled = [v for r in timed for v in (r.recent.spark_ms or [])]
        med = median(pooled) if pooled else median([r.recent.ms["step"] for r in timed])
        parts.append(f"{fmt_ms(med)} ms/step "
                     f"(worst rank {worst.rank} {fmt_ms(worst.recent.ms['step'])})")
    rates = [x for x in (rate(r) for r in active) if x is not None]
    if rates and last >= 0:
        parts.append(f"{median(rates):.1f} steps/s per rank")
    inputs = [r.recent.ms.get("input") for r in active if r.recent.ms.get("input") is not None]
    if inputs and timed:
        parts.append(f"input {fmt_ms(median(inputs))} ms")
    mems = [r.recent.mem_peak for r in st.ranks if r.recent.mem_peak]
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
        parts.append(f"so far: {v.kind.replace('_', '-')}")
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
#: the table's columns, most important first: at a narrow terminal the last ones are dropped
#: whole (a number is never cut: rich would cut a too-narrow column to "0..."). ``own`` is the
#: rank's own work per step (step - its wait for the others: ``comm`` where measured, else
#: backward): under DDP every rank's step time is the same, and the straggler is the rank whose own
#: time is highest.
PRIORITY = ("rank", "step ms", "status", "step", "own", "input", "steps/s", "fwd", "bwd", "comm",
            "opt", "mem", "h2d", "where", "recent steps")
#: what rich puts between two columns: padding on both sides and the box's separator
_GAP = 3


def compact_state(r: RankLive) -> str:
    """The state in at most ~10 characters, for narrow terminals (the notes below the table
    keep the whole sentence)."""
    age = _age_short(r.age_s)
    return {"ok": "ok", "starting": "no step", "stale": f"stale {age}", "gone": f"lost {age}",
            "ended": f"{r.bye or 'ended'}", "waiting": "waiting"}.get(r.state, r.state)


def _age_short(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m"


def own_ms(r: RankLive) -> Optional[float]:
    step = r.recent.ms.get("step")
    if step is None:
        return None
    wait = r.recent.ms.get("comm")
    if wait is None:
        wait = r.recent.ms.get("backward")
    return max(0.0, step - (wait or 0.0))


def _cells(st: LiveState, phases: list[str], compact: bool) -> dict[str, list[str]]:
    cells: dict[str, list[str]] = {k: [] for k in PRIORITY}
    for r in st.ranks:
        rt = rate(r)
        cells["rank"].append(str(r.rank))
        cells["where"].append(f"{r.host or '?'}:{r.local_rank}" if r.local_rank is not None else (r.host or "-"))
        cells["status"].append(compact_state(r) if compact else r.short)
        cells["step"].append(str(r.last_step + 1 if r.last_step >= 0 else "-"))
        cells["steps/s"].append("-" if rt is None else f"{rt:.1f}")
        cells["step ms"].append(fmt_ms(r.recent.ms.get("step")))
        cells["own"].append(fmt_ms(own_ms(r)))
        for p in ("input", "forward", "backward", "optimizer", "h2d", "comm"):
            cells[_SHORT.get(p, p)].append(fmt_ms(r.recent.ms.get(p)) if p in phases else "")
        cells["mem"].append(fmt_bytes(r.recent.mem_peak))
        cells["recent steps"].append(sparkline(r.recent.spark_ms))
    return cells


def choose_columns(cells: dict[str, list[str]], width: int, skip: set[str]) -> list[str]:
    """The columns that fit ``width`` whole, by :data:`PRIORITY`, in display order."""
    chosen: list[str] = []
    used = 0
    for name in PRIORITY:
        if name in skip:
            continue
        w = max([len(name)] + [len(c) for c in cells[name]])
        need = w + (_GAP if chosen else 0)
        if used + need > width:
            continue  # a later, narrower column may still fit
        chosen.append(name)
        used += need
    order = ("rank", "where", "status", "step", "steps/s", "step ms", "own", "input", "fwd", "bwd",
             "comm", "opt", "h2d", "mem", "recent steps")
    return [c for c in order if c in chosen]


def render(st: Optional[LiveState], contact: tuple[bool, Optional[float], Optional[str]],
           width: int = 160, height: int = 50) -> Any:
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
    shown = {p for p in ("h2d", "comm") if any(r.recent.ms.get(p) is not None for r in st.ranks)}
    phases = [p for p in PHASES if p != "step" and (p not in ("h2d", "comm") or p in shown)]
    compact = width < 120
    cells = _cells(st, phases, compact)
    skip = {"h2d", "comm"} - shown
    cols = choose_columns(cells, width, skip)
    # rows that fit the height: everything else on screen is counted first
    v = verdict_so_far(st)
    fixed = len(items) + 2 + len(st.nodes) * (2 if compact else 1) + min(8, len(st.stale_ranks))
    if v:
        fixed += 1 + len(v.why) // max(20, width - 10)
    rows_fit = max(1, min(MAX_ROWS, height - fixed - 2))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for name in cols:
        t.add_column(name, justify="left" if name in ("where", "status", "recent steps") else "right",
                     no_wrap=True)
    shown = st.ranks[:rows_fit]
    for i, r in enumerate(shown):
        row = [Text(cells[c][i], style=_STATE_STYLE.get(r.state, "")) if c == "status" else cells[c][i]
               for c in cols]
        t.add_row(*row)
    items.append(t)
    if len(st.ranks) > len(shown):
        items.append(Text(f"... {len(st.ranks) - len(shown)} more ranks", style="dim"))
    dropped = [c for c in PRIORITY if c not in cols and c not in skip]
    if dropped and width < 160:
        items.append(Text(f"(too narrow for: {', '.join(dropped)}; widen the terminal to see them)",
                          style="dim"))
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
    if v:
        items.append(Text.assemble(("so far: ", "bold"), (v.kind.upper().replace("_", "-"),
                                                          "bold magenta"),
                                   f" ({v.severity}): {v.why}"))
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
        # rich's own lock for its render and refresh (an RLock); our own if a rich version lacks it
        self._print_lock = getattr(self.live, "_lock", None) or threading.RLock()
        self.pump = OutputPump(self._print)

    def _renderable(self) -> Any:
        try:
            size = self.console.size
            return render(self.feed.state(), self.feed.contact(), size.width, size.height)
        except Exception as exc:  # an exception here would kill rich's refresh thread: a frozen view
            from rich.text import Text
            return Text(f"TraceML live view error: {type(exc).__name__}: {exc}", style="red")

    def _print(self, text: str) -> None:
        """Print a line of training output above the view, as one write.

        Rich's refresh thread moves the cursor up by the height of the view it drew last and draws
        anew, all under the Live's lock; a print from this thread builds the same cursor movement
        but, without that lock, may write it after a refresh drew a view of another height: the
        cursor then lands on a line of training output and erases it (seen: the first frame with
        the ranks' rows took 'step 100' away). Holding the Live's lock makes build and write one.
        """
        from rich.text import Text

        with self._print_lock:
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
        self._last_step: Optional[int] = None  # step count of the previous line
        self._last_at: Optional[float] = None
        self._progress_at = 0.0  # when the step count last moved

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
                    now = self._clock()
                    since = None if self._last_at is None else now - self._progress_at
                    self._write(status_line(st, self.feed.contact(), self._last_step, since))
                    step = None if st is None else max((r.last_step for r in st.ranks), default=-1) + 1
                    if step != self._last_step:
                        self._progress_at = now
                    self._last_step, self._last_at = step, now
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
