"""The aggregator process's core: the framed server (wire/server.py) with the aggregator's rules,
and the run's lifecycle.

Who may connect (wire/auth.py): each node's relay (kind ``node``, the run token) and node 0's
launcher (kind ``control``, the control key). Ranks never connect here: they talk to their node's
relay. What a frame does is :mod:`.ingest`; the pre-authentication limits, buffers, write queues
and rate-limited logging are the framed server's.

Ending (whichever comes first):

* ``finish`` from the launcher: read what is still in flight for up to ``drain_s`` (or until every
  rank connection closed), write the summary, answer ``finished``, exit 0;
* SIGTERM/SIGINT: checkpoint and write a provisional summary at once, then wait up to
  ``term_grace_s`` for the launcher's ``finish`` (a second signal ends the wait);
* every expected rank said ``bye`` and no launcher is connected;
* the launcher's connection dropped without ``finish``: wait up to ``launcher_lost_grace_s`` for
  the ranks to close, then finish with what we have.
"""

from __future__ import annotations

import errno
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ..exporters import live_kinds
from ..codec import decode, encode
from ..options import BY_KEY
from ..rundata import HangReport, LaunchEnd, RunData
from ..wire.auth import AGGREGATOR, Endpoint, Identity, NonceCache, check_hello
from ..wire.frames import REFUSED, validate
from ..wire.protocol import ProtocolError
from ..wire.server import Conn, FramedServer, Handler, Limits, listen
from .adapter import run_data
from .ingest import Ingest
from .claim import Claim
from ..rundir import CHECKPOINT_NAME, RunDir, foreign_checkpoint, pack_checkpoint, write_file
from .settings import AggregatorSettings
from .state import VALUES_REFUSED, RunState

TICK_S = 0.2
#: seconds between two looks of the hang detection at the run's progress
HANG_WATCH_S = 1.0
#: seconds between two verdicts of the run so far, for the log (a straggler once confirmed);
#: at least 20 times what building one took (a large run's summary takes about a second)
LIVE_VERDICTS_S = 15.0
#: the verdicts said in the job's log as soon as they are confirmed (warning or critical): they
#: name a rank, and every step of every rank waits for it
LIVE_VERDICT_KINDS = ("straggler", "work_imbalance")
#: the largest share of wall-clock time spent writing checkpoints (the interval stretches)
CHECKPOINT_SHARE = 0.02
#: the most checkpoint bytes written per second on average (the interval stretches): the logs
#: directory is usually a shared file system, and a run of 16,384 ranks has ~640 MB checkpoints
CHECKPOINT_BYTES_PER_S = 1_000_000


def log(msg: str) -> None:
    try:
        sys.stderr.write(f"traceml-aggregator: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class BindError(Exception):
    """The listening socket could not be opened; ``str()`` is the user-facing paragraph."""


def port_clash_hint(settings: AggregatorSettings) -> str:
    """The rest of the port-in-use sentence, fitting where the port came from."""
    src, multi = settings.port_source, settings.nnodes > 1
    same = " (the same on every node of the job)" if multi else ""
    if src.startswith("slurm:"):
        return ("probably by another job on this node whose job id is a multiple of 1,024 away "
                "(job-derived ports repeat every 1,024 jobs), or a previous run still shutting down. "
                f"Pass a free port with --aggregator-port PORT (or TRACEML_AGGREGATOR_PORT){same}.")
    if src == "free":  # ports.FREE_SOURCE: picked free a moment ago, taken since
        return ("taken by another process since it was picked as a free port. Run again (a new "
                "free port is picked), or pass one with --aggregator-port PORT.")
    if src == "default":
        fix = "--standalone (free local ports) or " if not multi else ""
        return ("probably by another `traceml run` on this machine using the same default port, or a "
                f"previous run still shutting down. Use {fix}--aggregator-port PORT with a free port"
                f"{same}.")
    unset = (" or unset it so the job-derived port is used" if settings.job_id
             else f" or unset it to use the default ({BY_KEY['aggregator_port'].default})")
    return ("probably by another job or a previous run still shutting down. Pass another free port "
            f"with --aggregator-port PORT (or TRACEML_AGGREGATOR_PORT){same},{unset}.")


def open_listener(settings: AggregatorSettings) -> socket.socket:
    host = settings.bind_host
    try:
        return listen(host, settings.port)
    except OSError as exc:
        where = f"{host}:{settings.port}"
        src = f" (from {settings.port_source})" if settings.port_source != "default" else ""
        if exc.errno == errno.EADDRINUSE:
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: port {settings.port}{src} is "
                f"already in use on this node, {port_clash_hint(settings)}") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: {host} is not an address of "
                "this node. Set --aggregator-bind-host (or TRACEML_AGGREGATOR_BIND_HOST) to an "
                "interface address of node 0, or 0.0.0.0.") from None
        if exc.errno == errno.EACCES:
            raise BindError(
                f"The TraceML aggregator cannot listen on {where}: permission denied (ports below "
                "1024 need root). Choose --aggregator-port above 1024.") from None
        raise BindError(f"The TraceML aggregator cannot listen on {where}: {exc.strerror}. "
                        "Check --aggregator-bind-host and --aggregator-port.") from None


def raise_fd_limit() -> None:
    """Thousands of connections need thousands of sockets; lift the soft limit to the hard one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass


class Server(Handler):
    """The aggregator: a :class:`~traceml_core.wire.server.FramedServer` whose handler applies
    frames through :class:`~.ingest.Ingest`, plus the run's lifecycle (end conditions,
    checkpoints, finalisation)."""

    def __init__(self, settings: AggregatorSettings, listener: socket.socket, run_dir: RunDir,
                 finalize: Callable[["Server", RunData, bool], dict[str, Any]],
                 claim: Optional[Claim] = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        #: this run's claim of its directory (aggregator/claim.py): touched while it runs
        self.claim = claim
        self.state = RunState(settings)
        self.state.run_dir_note = run_dir.note
        if settings.resume_from:
            self._resume(settings.resume_from)
        self.ingest = Ingest(self.state, log)
        self.endpoint = Endpoint(
            aud=AGGREGATOR, run=settings.run_name, job=settings.job_id,
            keys={"node": settings.token, "group": settings.token, "control": settings.control_token},
            nnodes=settings.nnodes, nproc_per_node=settings.nproc_per_node, fan_in=settings.relay_fan_in)
        self.nonces = NonceCache()
        self.net = FramedServer(
            listener, self, counters=self.state.counters, log=log, name="",
            limits=Limits(hello_timeout_s=settings.handshake_timeout_s,
                          max_pending=settings.max_pending_handshakes,
                          max_buffered=settings.max_buffered_bytes))
        self.port = self.net.port
        self._finalize_cb = finalize
        self._req_id = 0
        #: (connection, request id) to answer when the autopsy in progress is done
        self._autopsy_for: Optional[tuple[Conn, Any]] = None
        #: hang detection (aggregator/hangwatch.py): when to read the ranks, when it is a hang
        from .hangwatch import HangWatch
        from .notices import Notices

        #: lines for the job's log, said by node 0's launcher as it polls (aggregator/notices.py)
        self.notices = Notices()
        self.hangwatch = HangWatch(settings.hang_report_after, self.notices)
        self._next_hang_watch = 0.0
        #: verdicts confirmed while the run goes on and already said in the log: (kind, rank)
        self._said: set[tuple[str, Any]] = set()
        self._next_live_verdicts = time.monotonic() + LIVE_VERDICTS_S
        self.done = False
        self.result: Optional[dict[str, Any]] = None
        # ending state
        self.finish_conn: Optional[Conn] = None
        self.drain_until: Optional[float] = None
        self.signals = 0
        self.term_until: Optional[float] = None
        self.launcher_lost_until: Optional[float] = None
        now = time.monotonic()
        self._next_checkpoint = now + settings.checkpoint_interval_s
        self._next_tick = now + TICK_S
        self.checkpoint_seconds = 0.0
        #: --export wandb|mlflow|prometheus: batches of the run so far, paced (exporters/live.py)
        self.exports: Optional[Any] = None
        if any(k in live_kinds() for k in settings.export):
            from ..attempts import attempt_dirs
            from ..exporters.batch import RunIdentity
            from ..exporters.live import live_exports

            identity = RunIdentity(
                run_name=settings.run_name, job_id=settings.job_id, started_at=settings.started_at,
                nnodes=settings.nnodes, nproc_per_node=settings.nproc_per_node,
                hostnames=tuple(settings.hostnames), script=settings.script, run_dir=str(run_dir.path),
                attempt=len(attempt_dirs(run_dir.path)))
            self.exports = live_exports(identity, run_dir.path, settings.export, settings.export_interval_s,
                                        settings.export_settings)
        #: run once the launcher has the final summary and the connections are closed (the live
        #: exports' last batch and files: bounded, and the launcher waits for no one but the reply)
        self.after_reply: Optional[Callable[[], None]] = None

    def _resume(self, path: str) -> None:
        """Go on from the checkpoint of the aggregator that died (see resume.py)."""
        from ..rundir import load_checkpoint

        try:
            doc = load_checkpoint(Path(path))
        except (OSError, ValueError) as exc:
            log(f"cannot resume from {path} ({exc}); starting from nothing: the summary counts "
                "every earlier record as lost")
            return
        other = foreign_checkpoint(doc, self.settings)
        if other is not None:
            log(f"not resuming from {path}: it is the checkpoint of {other}, not of this run; "
                "starting from nothing: the summary counts every earlier record as lost")
            return
        self.state.go_on_from(decode(RunData, doc["state"]))
        log(f"resumed from the checkpoint taken {max(0.0, time.time() - doc['taken_at']):.1f} s "
            f"before this restart ({self.state.records:,} records); records the previous "
            "aggregator received after it are counted as lost")

    # --- loop --------------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            self.signals += 1
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for name in ("SIGUSR1", "SIGUSR2", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)

    def serve_forever(self) -> dict[str, Any]:
        while not self.done:
            self.step(TICK_S)
        return self.result or {}

    def step(self, timeout: float) -> None:
        """One turn of the loop: serve ready sockets, then the periodic work when due."""
        self.net.step(timeout)
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            self._tick(now)

    def _tick(self, now: float) -> None:
        if self.claim is not None:
            self.claim.refresh(now)
        if self.ingest.autopsy is not None and self.ingest.autopsy.done(now):
            self._autopsy_done()
        if self.state.hangs:
            self._stall_over()
        if now >= self._next_hang_watch and not self.finishing:
            self._next_hang_watch = now + HANG_WATCH_S
            self._watch_hangs(now)
        if now >= self._next_live_verdicts and not self.finishing:
            self._live_verdicts(now)
        if self.signals:
            self._on_signal(now)
        if self._should_finalize(now):
            self.finalize()
            return
        if now >= self._next_checkpoint:
            self.checkpoint()
        if self.exports is not None and self.exports.due(now) and not self.finishing:
            self.exports.tick(self._summary_so_far)

    def _live_verdicts(self, now: float) -> None:
        """Say in the job's log a straggler (or another rank's verdict of LIVE_VERDICT_KINDS) once
        the verdicts of the run so far confirm it, once per kind and rank."""
        t0 = time.perf_counter()
        try:
            doc = self._summary_so_far() if self.state.records else None
        except Exception:  # noqa: BLE001 - a verdict of the run so far must never cost the run
            doc = None
        took = time.perf_counter() - t0
        self._next_live_verdicts = time.monotonic() + max(LIVE_VERDICTS_S, 20 * took)
        for v in doc.verdicts if doc else []:
            if v.kind not in LIVE_VERDICT_KINDS or v.severity not in ("warning", "critical"):
                continue
            key = (v.kind, (v.culprit or {}).get("rank"))
            if key not in self._said:
                self._said.add(key)
                self.notices.say(f"{v.kind.replace('_', ' ')} confirmed ({v.severity}, "
                                 f"{self.state.records:,} step records in): {v.why}")

    def _summary_so_far(self) -> Any:
        """The provisional summary of the run so far (a live export's batch is built from it)."""
        from ..report.summary import build_document

        return build_document(run_data(self.state), provisional=True)

    def _on_signal(self, now: float) -> None:
        if self.term_until is None:
            self.term_until = now + self.settings.term_grace_s
            log("SIGTERM: writing a provisional summary, then waiting "
                f"{self.settings.term_grace_s:.0f} s for the launcher's exit report")
            self.signals = 1
            try:
                self.write_outputs(provisional=True)
            except Exception as exc:  # never die here: the final write may still succeed
                log(f"could not write the provisional summary: {exc}")
        elif self.signals > 1:
            log("second signal: finishing now")
            self.term_until = now

    @property
    def finishing(self) -> bool:
        return self.drain_until is not None

    def _should_finalize(self, now: float) -> bool:
        st = self.state
        ing = self.ingest
        if self.drain_until is not None:
            # every rank's connection ended and every other node's launcher said bye (its last
            # frame), or the drain time is up
            return (not ing.open_ranks() and not ing.nodes_pending()) or now >= self.drain_until
        if self.term_until is not None and (now >= self.term_until or
                                            (ing.control is None and ing.control_seen)):
            if st.finish is None:
                st.finish = LaunchEnd(interrupted=True, source="aggregator",
                                      reason="the aggregator received SIGTERM (scancel or time limit?) "
                                             "and the launcher sent no exit report")
            return True
        if self.launcher_lost_until is not None:
            if not ing.open_ranks() or now >= self.launcher_lost_until:
                if st.finish is None:
                    st.finish = LaunchEnd(source="aggregator",
                                          reason="the launcher's connection to the aggregator closed "
                                                 "without an exit report (launcher killed?)")
                return True
            return False
        if ing.control is None and len(st.ranks) >= self.settings.world_size:
            byes = [rs.bye for rs in st.ranks.values()]
            if all(byes):
                if st.finish is None:
                    failed = any(b.status != "clean" for b in byes)  # type: ignore[union-attr]
                    st.finish = LaunchEnd(source="ranks", reason="every rank ended (" + (
                        "some with an error" if failed else "all cleanly") + ")")
                return True
        return False

    # --- the handler (wire/server.py calls these) -----------------------------------------------
    def on_hello(self, conn: Conn, msg: dict[str, Any]) -> Union[Identity, str]:
        return check_hello(msg, self.endpoint, self.nonces)

    def on_accept(self, conn: Conn) -> None:
        i = conn.ident
        assert i is not None
        now = time.time()
        if i.kind == "group":
            self.ingest.group_joined(conn, i)
            return
        if i.kind == "node":
            old = self.ingest.node_joined(conn, i, now)
        else:
            old = self.ingest.control_joined(conn, i, now)
            self.launcher_lost_until = None
        if old is not None:
            self.net.close(old)

    def on_frame(self, conn: Conn, msg: dict[str, Any], data: Any, off: int, end: int) -> None:
        i = conn.ident
        assert i is not None
        if i.kind in ("node", "group"):
            # the link carries the node's other ranks: a bad frame is counted and skipped
            try:
                checked = validate(i.kind, msg)
                if checked is None:
                    self.state.counters["ignored_frames"] += 1
                    return
                self._count_refused(conn, checked)
                if i.kind == "group":
                    self.ingest.group_frame(conn, i, checked, time.time(), finishing=self.finishing)
                    return
                self.ingest.node_frame(conn, i, checked)
            except ProtocolError as exc:
                self.state.counters["malformed"] += 1
                self.net.events("relayed_malformed", f"{conn.label()}: skipped a bad relayed "
                                f"{str(msg.get('t'))[:20]!r} frame: {str(exc)[:200]}")
            return
        checked = validate("control", msg)  # a ProtocolError closes the control link
        if checked is None:
            self.state.counters["ignored_frames"] += 1
            return
        self._count_refused(conn, checked)
        t = checked["t"]
        if t == "finish":
            self.ingest.finish(checked)
            self.finish_conn = conn
            self.drain_until = time.monotonic() + self.settings.drain_s
        elif t == "query":
            reply = self.ingest.status(self.checkpoint_seconds)
            reply["id"] = msg.get("id")
            # the hang detection's lines for node 0's log, after the last one the launcher printed
            after = msg.get("notices_after")
            reply["notices"] = self.notices.after(after if type(after) is int else 0)
            self.net.send(conn, reply)
        elif t == "snapshot":  # live views (aggregator/snapshot.py; never raises)
            from .snapshot import snapshot_frame
            self.net.send(conn, snapshot_frame(self.state, checked))
        elif t == "system":
            self.ingest.system(i, checked)
        elif t == "autopsy":
            self._autopsy_start(conn, checked)
        elif t == "probe":      # the link probe between the nodes (traceml_core/linkprobe)
            self.state.probe = checked["result"]
            self.state.dirty = True

    def _count_refused(self, conn: Conn, checked: dict[str, Any]) -> None:
        """Values the validator left out as not measurements (NaN, infinite, past their field's
        physical bound: wire/frames.measured); the summary reports the count."""
        n = checked.get(REFUSED)
        if n:
            self.state.counters[VALUES_REFUSED] += n
            who = f" of rank {checked['rank']}" if type(checked.get("rank")) is int else ""
            self.net.events("values_refused", f"{conn.label()}: left out {n} value(s) of a "
                            f"{str(checked.get('t'))[:20]!r} frame{who} that are not measurements "
                            "(NaN, infinite or past their physical bound)")

    # --- the hang autopsy (aggregator/autopsy.py) and hang detection (hangwatch.py) ---------------
    def _watch_hangs(self, now: float) -> None:
        if self.ingest.autopsy is not None:
            return
        hw = self.hangwatch
        if hw.observe(now, self.state.records, bool(self.ingest.silent_ranks(1)), self.ingest.median_step_ms()):
            self._autopsy_start(None, {"silent_s": now - hw.last_progress, "threshold_s": 0.0,
                                       "threshold_source": ""})

    def _autopsy_start(self, conn: Optional[Conn], msg: dict[str, Any]) -> None:
        """Read every rank; ``conn`` None: a reading of the hang detection, else the launcher asked
        for a report (``--hang-timeout``), which it gets (the one declared for this silence, if
        there is one)."""
        if conn is not None:
            declared = self._declared_for_silence()
            if declared is not None:
                self.net.send(conn, {"t": "autopsy", "id": msg.get("id"), "report": encode(declared)})
                return
        if self.ingest.autopsy is not None:  # one at a time: this caller gets that one's report
            if conn is not None:
                self._autopsy_for = (conn, msg.get("id"))
            return
        from .autopsy import Autopsy

        req = self.request("stacks")
        self.ingest.autopsy = Autopsy(req, self.ingest.expected_ranks(), world=self.settings.world_size,
                                      silent_s=msg["silent_s"], threshold_s=msg["threshold_s"],
                                      threshold_source=msg["threshold_source"],
                                      records_at=self.state.records, reading=conn is None)
        if conn is not None:
            self._autopsy_for = (conn, msg.get("id"))

    def _declared_for_silence(self) -> Optional[HangReport]:
        """The hang report of the current silence, if the detection declared one."""
        s = self.hangwatch.silence
        if s is not None and s.declared and self.state.hangs \
                and self.state.hangs[-1].records_at == self.state.records:
            return self.state.hangs[-1]
        return None

    def _stall_over(self) -> None:
        """The last hang report's stall resolved when step records arrive again: how long none
        had (from the last records before it: the report's time less its collection and the
        silence it was asked about) goes into the report, for the summary."""
        h = self.state.hangs[-1]
        if h.stall_s is not None or self.state.records <= h.records_at:
            return
        now = time.time()
        began = (h.at or now) - (h.collect_s or 0.0) - h.silent_s
        h.resolved_at, h.stall_s = now, round(max(0.0, now - began), 1)
        self.state.dirty = True
        self.notices.say(f"the stall is over: step records arrive again, {h.stall_s:.1f} s after "
                              f"the last ones before it (since {time.strftime('%H:%M:%S', time.localtime(began))})")

    def _autopsy_done(self) -> None:
        autopsy, self.ingest.autopsy = self.ingest.autopsy, None
        try:
            report = autopsy.report()
        except Exception as exc:  # the analysis must never take the loop down
            log(f"could not build the hang report: {type(exc).__name__}: {exc}")
            report = None
        if autopsy.reading:
            declared = None
            if report is not None:
                try:
                    declared = self.hangwatch.reading(time.monotonic(), report, self.ingest.median_step_ms())
                except Exception as exc:  # never take the loop down
                    log(f"could not judge the ranks' state: {type(exc).__name__}: {exc}")
            if declared is not None:
                self.state.hangs.append(decode(HangReport, declared))
                self.state.dirty = True
                if self.exports is not None and not self.finishing:
                    self.exports.tick(self._summary_so_far)   # the hang goes out live at once
            if self._autopsy_for is None:
                return
            if declared is not None:
                report = declared
            elif report is not None:   # the launcher asked meanwhile: its report is this reading
                self.state.hangs.append(decode(HangReport, report))
                self.state.dirty = True
        elif report is not None:
            self.state.hangs.append(decode(HangReport, report))
            self.state.dirty = True
        target = self._autopsy_for
        self._autopsy_for = None
        if target is not None and not target[0].closed:
            self.net.send(target[0], {"t": "autopsy", "id": target[1], "report": report})

    def on_close(self, conn: Conn) -> None:
        i = conn.ident
        assert i is not None
        if i.kind == "group":
            self.ingest.group_closed(conn, time.time(), finishing=self.finishing)
            return
        if self.ingest.link_closed(conn, i, time.time(), finishing=self.finishing) \
                and self.state.finish is None and self.drain_until is None and self.term_until is None:
            self.launcher_lost_until = time.monotonic() + self.settings.launcher_lost_grace_s
            log("the launcher's control connection closed without an exit report; "
                f"finishing within {self.settings.launcher_lost_grace_s:.0f} s")

    # --- downstream ------------------------------------------------------------------------------
    def request(self, kind: str, ranks: Optional[list[int]] = None,
                args: Optional[dict[str, Any]] = None) -> int:
        """Ask ranks (all, or ``ranks``) through their relays; answers arrive as ``resp`` frames
        (Ingest.resp). Returns the request id."""
        self._req_id += 1
        frame = {"t": "req", "id": self._req_id, "kind": kind, "ranks": ranks, "args": args or {}}
        validate("down", dict(frame))  # the same rule the receiving end applies
        for c in self.ingest.links():
            self.net.send(c, frame)
        return self._req_id

    # --- persistence and the end ----------------------------------------------------------------
    def checkpoint(self, *, final: bool = False, run: Optional[RunData] = None) -> Optional[float]:
        """Write the aggregate state (``run``: the run data of it, when made already) atomically;
        returns the seconds it took (None = skipped)."""
        now = time.monotonic()
        if not self.state.dirty and not final and run is None:
            self._next_checkpoint = now + self.settings.checkpoint_interval_s
            return None
        t0 = time.perf_counter()
        blob = b""
        try:
            blob = pack_checkpoint(encode(run if run is not None else run_data(self.state)), final=final)
            write_file(self.run_dir, self.settings.run_name, CHECKPOINT_NAME, blob, sync=final)
            self.state.run_dir_note = self.run_dir.note
            self.state.dirty = False
        except Exception as exc:  # noqa: BLE001 - a failed checkpoint must never end the aggregator
            log(f"could not write the checkpoint: {type(exc).__name__}: {exc}")
        dt = time.perf_counter() - t0
        self.checkpoint_seconds += dt
        # never spend more than ~2 % of the wall clock on checkpoints, nor write more than
        # CHECKPOINT_BYTES_PER_S on average: at 16,384 ranks one takes ~2 s and ~640 MB, so one
        # every ~11 minutes (a rebuild after a SIGKILL misses at most that much of the
        # statistics, and says so); at 4,096 ranks ~110 MB every ~2 minutes; small runs keep
        # checkpoint_interval_s
        self._next_checkpoint = time.monotonic() + max(self.settings.checkpoint_interval_s,
                                                       dt / CHECKPOINT_SHARE,
                                                       len(blob) / CHECKPOINT_BYTES_PER_S)
        return dt

    def write_outputs(self, *, provisional: bool = False) -> dict[str, Any]:
        run = run_data(self.state)
        self.checkpoint(final=not provisional, run=run)
        run.run_dir_note = self.run_dir.note
        return self._finalize_cb(self, run, provisional)

    def finalize(self) -> None:
        try:
            result = self.write_outputs()
        except Exception as exc:  # the summary must never take the loop down silently
            log(f"could not write the final summary: {type(exc).__name__}: {exc}")
            result = {"summary_json": None, "summary_txt": None,
                      "error": f"{type(exc).__name__}: {exc}"}
        self.result = result
        if self.claim is not None:
            self.claim.end()
        reply = {"t": "finished", "summary_json": result.get("summary_json"),
                 "summary_txt": result.get("summary_txt"), "rebuilt": False}
        if result.get("error"):
            reply["error"] = result["error"]
        ing = self.ingest
        target = self.finish_conn if self.finish_conn is not None and not self.finish_conn.closed \
            else ing.control
        if target is not None and not target.closed:
            self.net.send(target, reply)
            self.net.drain_writes(target, 2.0)
        # the relays hear that this close is the end of the run, not a failure to report
        links = ing.links()
        for c in links:
            self.net.send(c, {"t": "end"})
        for c in links:
            self.net.drain_writes(c, 0.2)
        self.net.close_all()
        if self.after_reply is not None:  # the live exports' end: after the launcher has its reply
            try:
                self.after_reply()
            except Exception as exc:  # noqa: BLE001 - the summary is written; nothing may undo that
                log(f"live exports failed at the end: {type(exc).__name__}: {exc}")
        self.done = True

    def close(self) -> None:
        self.net.close_all()
        self.net.poller.close()


__all__ = ["Server", "BindError", "open_listener", "raise_fd_limit", "log"]
