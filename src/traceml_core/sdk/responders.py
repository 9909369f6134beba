"""A rank's answers to requests from node 0 (``req`` frames; the kinds are the table
``traceml_core.wire.frames.REQUESTS``). They run on the telemetry client's thread, never on the
training thread, and must be cheap: read state, build a small map.

To add a request kind: a row in ``wire/frames.REQUESTS`` (its argument and answer validators) and
a function here, registered in :data:`RESPONDERS`, taking ``(session, args)`` and returning the
answer's ``data``.
"""

from __future__ import annotations

from typing import Any, Callable

#: kind -> fn(session, args) -> data
RESPONDERS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {}


def responder(kind: str) -> Callable[[Callable[[Any, dict[str, Any]], Any]], Callable[[Any, dict[str, Any]], Any]]:
    def register(fn: Callable[[Any, dict[str, Any]], Any]) -> Callable[[Any, dict[str, Any]], Any]:
        RESPONDERS[kind] = fn
        return fn
    return register


@responder("counts")
def counts(session: Any, args: dict[str, Any]) -> dict[str, int]:
    rec, client = session.recorder, session.client
    return {"produced": rec.count, "sent": client.stats().records_sent, "lost": rec.lost}


@responder("stacks")
def stacks(session: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Where this rank is, as its interpreter knows it: every thread's stack (read here, on the
    client thread, never from a signal handler: sdk/stackdump.py says why), the collective in
    flight and its step. Its relay adds what the kernel knows of the process."""
    from ..wire.frames import MAX_STACK_TEXT
    from .stackdump import snapshot, thread_stacks

    out = snapshot(session.tracer)
    out.pop("ts", None)
    out["source"] = "sdk"
    out["text"] = thread_stacks(MAX_STACK_TEXT)
    return out


def answer(session: Any, req: dict[str, Any]) -> None:
    """Answer one validated ``req`` on the session's client (unknown kinds are ignored)."""
    fn = RESPONDERS.get(req["kind"])
    if fn is None or session.client is None:
        return
    try:
        data = fn(session, req.get("args") or {})
    except Exception:  # never let a request hurt the rank
        return
    session.client.submit({"t": "resp", "id": req["id"], "rank": session.rank, "kind": req["kind"],
                           "data": data})
