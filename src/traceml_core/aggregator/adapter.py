"""The one adapter from what the aggregator holds to typed run data.

:func:`run_data` is the only place that reads the aggregator's state for the report: the
summary, the live verdict, the ledger and the checkpoints get a
:class:`~traceml_core.rundata.RunData`, never the aggregator's objects. It is built straight from
the state (a restarted aggregator's combined with the checkpoint it went on from, resume.py), and
a checkpoint is that same value through the one codec (:func:`checkpoint_data`), so a live summary
and one rebuilt from a checkpoint are made from the same data by the same code. The statistics
come in their own plain form (``WindowStats.to_data``), whose keys are the typed fields'.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..codec import decode, encode
from ..rundata import MemData, OutsideData, PhaseData, RankData, RunData, RunSettings, TotalsData
from ..wire.protocol import DURATION_COLUMNS
from .rankstate import RankState
from .resume import combine
from .state import RunState

#: the fields a rank's state keeps as the run data has them (its events are a bounded deque)
_KEPT = tuple(f.name for f in fields(RankData) if f.name in RankState.__slots__ and f.name != "events")


def run_data(state: RunState) -> RunData:
    """The run as the aggregator holds it now (pending frames are computed first). Shares the
    state's records (a goodbye, the facts): the report reads them, never changes them."""
    return combine(state.base, RunData(
        settings=decode(RunSettings, state.settings.public()),
        aggregator_started_at=state.aggregator_started_at,
        phases=list(DURATION_COLUMNS),
        ranks=[rank_data(state.ranks[r]) for r in sorted(state.ranks)],
        nodes=[state.nodes[n] for n in sorted(state.nodes)],
        system=[state.system[n].now() for n in sorted(state.system)],
        counters=dict(state.counters), records=state.records, finish=state.finish,
        run_dir_note=state.run_dir_note, hangs=list(state.hangs), probe=state.probe))


def rank_data(rs: RankState) -> RankData:
    st = rs.stats.to_data()
    return RankData(**{k: getattr(rs, k) for k in _KEPT}, events=list(rs.events or ()),
                    phases={k: PhaseData(**v) for k, v in st.pop("phases").items()},
                    sums={k: TotalsData(**v) for k, v in st.pop("sums").items()},
                    mem=MemData(**st.pop("mem")), outside=OutsideData(**st.pop("outside")), **st)


def checkpoint_data(state: RunState) -> dict[str, Any]:
    """What a checkpoint stores: the run data, plain (msgpack-able)."""
    return encode(run_data(state))
