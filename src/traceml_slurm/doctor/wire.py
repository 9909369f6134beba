"""Coordinator <-> agent messages, on the framing and hello of ``traceml_core.wire.protocol``.

The same transport as the rest of TraceML (``traceml_core.wire``): the coordinator listens with the
framed server, each agent connects with a blocking :class:`~traceml_core.wire.client.Link` and
sends a ``hello`` (kind and endpoint ``"doctor"``) whose HMAC proves it knows the doctor's token: a
fresh random value the coordinator made and handed to the agents in the srun environment
(``TRACEML_DOCTOR_TOKEN``), never sent on the wire. The coordinator answers ``welcome`` or
``refused`` like every endpoint does, and refuses a replayed hello. It does not apply the hello's
clock window: measuring clock skew is one of the checks, so a skewed node must still be heard.
After that, frames are maps whose ``t`` starts with ``d.``; the coordinator sends one
command at a time to an agent and waits (bounded) for its answer:

=================  ===========================================  =====================================
coordinator sends  meaning                                      agent answers
=================  ===========================================  =====================================
(agent first)      ``d.local``: outcomes of the node checks, facts (versions, config, addresses)
``d.clock``        read your clock                              ``d.clock`` ``now``
``d.listen``       listen on these ports (node 0)               ``d.listening`` per-port result, nonce
``d.probe``        connect to these host:ports                  ``d.probed`` per-target result
``d.unlisten``     close the listeners                          ``d.unlistened``
``d.fs-write``     write a nonce file in your logs dir          ``d.fs-written``
``d.fs-read``      read that file from your logs dir            ``d.fs-read``
``d.fs-clean``     remove it                                    ``d.fs-cleaned``
``d.torch``        run a gloo / nccl probe                      ``d.torch`` result
``d.agg-start``    node 0: start the real aggregator            ``d.agg-started`` ok, port
``d.agg-send``     send test step records to it                 ``d.agg-sent`` ok or stage + detail
``d.agg-finish``   node 0: finish it, read the summary          ``d.agg-finished`` ranks in the summary
``d.bye``          end                                          (closes)
=================  ===========================================  =====================================
"""

from __future__ import annotations

import hashlib
import hmac
import selectors
import time
from typing import Any, Iterable, Optional

from traceml_core.wire.auth import Endpoint, make_hello
from traceml_core.wire.client import Link, LinkError

ENV_ADDR = "TRACEML_DOCTOR_ADDR"
ENV_TOKEN = "TRACEML_DOCTOR_TOKEN"
ENV_OPTS = "TRACEML_DOCTOR_OPTS"
#: TEST HOOK ONLY: ``node2=120,node3=-5`` adds seconds to that node's clock reading in d.clock.
#: Linux time namespaces cannot offset CLOCK_REALTIME, so a real per-node skew cannot be made on one
#: machine; this lets the cluster tests exercise the clock-skew check end to end.
ENV_CLOCK_HOOK = "TRACEML_DOCTOR_TEST_CLOCK_OFFSET"
HELLO_KIND = "doctor"


def recv_by(link: Link, deadline: float) -> Optional[dict[str, Any]]:
    """The next frame from ``link``, or None when the deadline passes or the peer closes."""
    try:
        return link.recv(max(0.0, deadline - time.monotonic()))
    except LinkError:
        return None


def doctor_hello(token: str, *, node: int, host: str) -> dict[str, Any]:
    return make_hello(token, aud=HELLO_KIND, run=HELLO_KIND, job=None, node=node, rank=node,
                      kind=HELLO_KIND, host=host)


def doctor_endpoint(token: str, nnodes: int) -> Endpoint:
    """What the coordinator accepts: agents of this doctor run (no clock window: measuring clock
    skew is one of the checks, so a skewed node must still be heard)."""
    return Endpoint(aud=HELLO_KIND, run=HELLO_KIND, job=None, keys={HELLO_KIND: token},
                    nnodes=max(1, nnodes), window_s=None)


def gather(links: Iterable[Link], deadline: float) -> dict[str, dict[str, Any]]:
    """One frame from each link, all read in parallel, until ``deadline``: ``{link.name: frame}``."""
    want = {ln.name: ln for ln in links if not ln.closed}
    got: dict[str, dict[str, Any]] = {}
    for name, ln in list(want.items()):
        if ln.ready:
            got[name] = ln.ready.popleft()
            del want[name]
    if not want:
        return got
    sel = selectors.DefaultSelector()
    for ln in want.values():
        sel.register(ln.sock, selectors.EVENT_READ, ln)
    try:
        while want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                ln = key.data
                ln.pump()
                if ln.ready:
                    got[ln.name] = ln.ready.popleft()
                if ln.name in got or ln.closed:
                    sel.unregister(ln.sock)
                    del want[ln.name]
    finally:
        sel.close()
    return got


def aggregator_token(doctor_token: str) -> str:
    """The token of the test aggregator (cross.aggregator), derived from the doctor's token so that
    every agent knows it and it never crosses the network."""
    return hmac.new(doctor_token.encode(), b"traceml-doctor-aggregator", hashlib.sha256).hexdigest()[:32]


def probe_token(doctor_token: str) -> str:
    """The token of the link probe between the agents (cross.link-bandwidth), derived like
    :func:`aggregator_token`."""
    return hmac.new(doctor_token.encode(), b"traceml-doctor-link-probe", hashlib.sha256).hexdigest()[:32]


def parse_clock_hook(text: str, node: str) -> float:
    for item in (text or "").split(","):
        name, _, secs = item.partition("=")
        if name.strip() == node:
            try:
                return float(secs)
            except ValueError:
                return 0.0
    return 0.0
