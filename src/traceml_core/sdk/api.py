"""The public SDK: ``init``, ``trace_step``, ``shutdown``, ``wrap_dataloader``, ``stats``.

``import traceml_core as traceml`` exposes these lazily (importing the package does not import
torch). The contract with training code:

* nothing here raises into training, blocks it for longer than its stated window, or changes
  what the user's code computes;
* ``init()`` reads the launcher's hand-over (:class:`~traceml_core.runinfo.RunInfo` in
  ``TRACEML_RUN_INFO``, plus torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``) once; keyword
  arguments override it for use without ``traceml run``;
* without run info (a plain ``python train.py`` or ``torchrun train.py``) and without an explicit
  ``aggregator=``, tracing is off: rank 0 logs one line saying so, ``trace_step`` returns a no-op
  context and nothing is recorded;
* with run info but no aggregator answering within ``connect_wait``, one warning is logged and
  training goes on: steps are still recorded into the bounded buffer while the client keeps
  retrying in the background, so a late aggregator still gets them, and whatever does not fit is
  counted (``stats()["lost"]``, and the ``dropped`` field the aggregator receives);
* ``shutdown()`` (also run at exit) flushes and sends ``bye`` within ``flush_timeout`` (2 s);
* an uncaught exception sends its traceback as an ``event`` and the ``bye`` says ``error``
  (``interrupted`` for KeyboardInterrupt); the exception is printed and the process exits
  exactly as without TraceML. A failing ``sys.exit(n)`` (n not 0/None) never reaches the
  exception hook, so ``sys.exit`` and the builtin ``exit``/``quit`` are wrapped to mark the rank
  ``error`` ("sys.exit(n)") before exiting as usual. SIGTERM is not handled here (a Python-level handler would delay a worker stuck in a C call from dying); the
  aggregator sees such a rank's connection close without ``bye``.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

from . import hooks
from . import session as sessions
from .session import DEFAULT_FLUSH_TIMEOUT, InitArgs, Session, warn_once
from .step import NULL_CONTEXT
from .tracer import TRACER

#: re-entrant: ``init()`` imports torch, and the worker bootstrap's hook on that import calls
#: ``init()`` again in the same thread (a script that calls ``init()`` before ``import torch``);
#: with a plain lock that call waited for itself for ever
_init_lock = threading.RLock()
#: the thread running ``init()`` now (None when none is)
_init_thread: Optional[int] = None
#: what :func:`after_init` deferred while ``init()`` was running in its own thread
_after_init: list[Callable[[bool], None]] = []
# ---- init ---------------------------------------------------------------------------------------


def init(
    *,
    aggregator: Optional[str] = None,
    token: Optional[str] = None,
    run_name: Optional[str] = None,
    job_id: Optional[str] = None,
    rank: Optional[int] = None,
    local_rank: Optional[int] = None,
    world_size: Optional[int] = None,
    node_rank: Optional[int] = None,
    connect_wait: Optional[float] = None,
    flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
    batch_size: int = 1024,
    max_buffered_steps: int = 65_536,
    enabled: bool = True,
) -> bool:
    """Start telemetry for this process; returns True if steps are being recorded.

    Call once, before the training loop (a second call is ignored). Every argument is optional
    under ``traceml run``. Without the launcher, ``aggregator="host:port"`` and ``token`` point
    the process at an aggregator directly. ``connect_wait`` bounds how long this call may wait
    for the aggregator's welcome (default: the launcher's value, else 3 s).
    """
    global _init_thread
    with _init_lock:
        if sessions.current is not None:
            # set up already, or being set up by this very thread (a call from an import hook
            # that init's own import fired): the caller gets the state as it is now, and
            # after_init() is how such a caller acts once init has finished
            return sessions.current.active
        s = sessions.current = Session(InitArgs(
            aggregator, token, run_name, job_id, rank, local_rank, world_size, node_rank, connect_wait,
            flush_timeout, batch_size, max_buffered_steps, enabled))
        _init_thread = threading.get_ident()
        try:
            s.start(os.environ)
        except Exception as exc:   # never into training
            warn_once("init-failed", "traceml: init failed (%s: %s); telemetry is off for this "
                      "process, training continues", type(exc).__name__, exc)
            s.teardown_quietly()
        finally:
            _init_thread = None
        deferred = list(_after_init)
        _after_init.clear()
    for fn in deferred:
        _call_quietly(fn, s.active)
    return s.active


def init_running_here() -> bool:
    """True while ``init()`` is running in the calling thread (so the caller is inside it)."""
    return _init_thread is not None and _init_thread == threading.get_ident()


def after_init(fn: Callable[[bool], None]) -> None:
    """Call ``fn(active)`` once ``init()`` has finished: at once if it has, or when the
    ``init()`` running in this thread returns (an import hook fired from inside it must not
    start what needs a finished session, nor wait for it)."""
    if init_running_here():
        _after_init.append(fn)
        return
    s = sessions.current
    _call_quietly(fn, bool(s is not None and s.active))


def _call_quietly(fn: Callable[[bool], None], active: bool) -> None:
    try:
        fn(active)
    except Exception as exc:   # never into training
        warn_once("after-init-failed", "traceml: a step after init failed (%s: %s); training "
                  "continues", type(exc).__name__, exc)


# ---- trace_step ---------------------------------------------------------------------------------

def trace_step(model: Any = None, step: Optional[int] = None) -> Any:
    """``with traceml.trace_step(model):`` around one training step.

    Pass the model that the step calls (a DDP wrapper or the bare module) so its forward is
    timed; ``model=None`` records everything else. Calls ``init()`` on first use if the script
    did not. Nested ``trace_step`` blocks count as one step (the outermost). ``step``: the
    script's own global step number (0-based, as a resumed run counts it), so the goodput
    ledger counts the steps a requeued attempt redid exactly (docs/goodput.md).
    """
    t = TRACER
    if not t.on:
        if sessions.current is not None:
            return NULL_CONTEXT
        init()
        if not t.on:
            return NULL_CONTEXT
    if model is not None and id(model) != t.model_id:
        t.register_model(model)
    if step is not None and not t.active:
        _progress(step)
    return t.trace_ctx


def _progress(step: Any) -> None:
    from .spans import PROGRESS

    if type(step) is int and step >= 0:
        try:
            PROGRESS.step(step)
        except Exception:  # noqa: BLE001 - a progress mark must never cost the step
            pass


def shutdown(timeout: Optional[float] = None) -> None:
    """Flush, send ``bye`` and stop, within ``timeout`` (default: init's ``flush_timeout``).

    Runs automatically at interpreter exit; calling it earlier is fine (later steps are not
    recorded). Idempotent.
    """
    if sessions.current is not None:
        sessions.current.shutdown(timeout)


# ---- data loaders and stats ---------------------------------------------------------------------

class _TimedIterator:
    """Iterator wrapper for non-torch loaders; fetches are credited like DataLoader ones."""

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it

    def __iter__(self) -> "_TimedIterator":
        return self

    def _plain_next(self) -> Any:
        return next(self._it)

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


_TimedIterator.__next__ = hooks.fetch(_TimedIterator._plain_next, TRACER)  # type: ignore[attr-defined]


class TimedIterable:
    """What :func:`wrap_dataloader` returns for a non-torch iterable: same ``len`` and attributes."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._inner = iterable

    def __iter__(self) -> _TimedIterator:
        return _TimedIterator(iter(self._inner))

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def declare_work(*, tokens_per_step: Optional[float] = None, samples_per_step: Optional[float] = None,
                 flops_per_step: Optional[float] = None, dtype: Any = None) -> None:
    """Declare what one training step of this rank is worth: tokens/s, samples/s and MFU in the
    summary's goodput ledger (see :func:`traceml_core.sdk.work.declare_work`). Never raises."""
    from . import work

    try:
        work.declare_work(tokens_per_step=tokens_per_step, samples_per_step=samples_per_step,
                          flops_per_step=flops_per_step, dtype=dtype)
    except Exception:  # noqa: BLE001 - a declaration must never cost training
        pass


def wrap_dataloader(loader: Any) -> Any:
    """Time batch fetches from ``loader``.

    A ``torch.utils.data.DataLoader`` needs no wrapping (its iterator class is instrumented once
    by ``init``) and is returned unchanged. Any other iterable (a generator factory, a streaming
    dataset client) is wrapped so fetches count as input wait; ``len()`` and attributes pass
    through.
    """
    try:
        from torch.utils.data import DataLoader

        if isinstance(loader, DataLoader):
            return loader
    except Exception:
        pass
    return TimedIterable(loader)


def stats() -> dict[str, Any]:
    """This process's telemetry counters, e.g. for a test or an end-of-run log line.

    ``steps`` recorded, ``sent`` (step records handed to the network), ``lost`` (records that
    could not be delivered: buffer full, refused, flush timed out), ``buffered`` (waiting),
    ``connected``, ``refused`` (the server's reason), ``reason_off`` (why tracing is off).
    """
    s = sessions.current
    if s is None:
        return {"enabled": False, "initialized": False, "reason_off": "init() not called"}
    r = s.recorder
    out: dict[str, Any] = {
        "enabled": TRACER.on, "initialized": True, "rank": s.rank,
        "local_rank": s.local_rank, "world_size": s.world, "node_rank": s.node, "run": s.run,
        "reason_off": s.reason_off, "status": s.status,
        "steps": r.count if r is not None else 0,
        "lost": r.lost if r is not None else 0,
        "buffered": r.buffered if r is not None else 0,
        "cuda_fallbacks": getattr(TRACER.timing, "fallbacks", 0) if r is not None else 0,
    }
    from ..wire.client import ClientStats

    cs = s.client.stats() if s.client is not None else ClientStats()
    out.update(sent=cs.records_sent, connected=cs.connected, connects=cs.connects, refused=cs.refused,
               frames_dropped=cs.frames_dropped, bye_sent=cs.bye_sent,
               aggregator=f"{s.client.host}:{s.client.port}" if s.client is not None else None)
    return out


def _reset_for_tests() -> None:
    """Forget the session (tests run several inits in one process). Not public API."""
    s = sessions.current
    if s is not None and not s.closed:
        shutdown(0.5)
    sessions.current = None
    sessions._warned.clear()
    TRACER.reset()
    from . import work

    work._reset_for_tests()
