"""The one adapter from what the aggregator holds to typed run data.

:func:`run_data` is the only place that reads the aggregator's state for the report: the
summary, the live verdict and the ledger get a :class:`~traceml_core.rundata.RunData`, never the
aggregator's objects. Today it goes through the aggregator's plain data (:meth:`RunState.to_data`,
the shape checkpoints store, combined with the checkpoint a restarted aggregator went on from), so
a live summary and one rebuilt from a checkpoint are made from the same data by the same code
(``RunData.from_checkpoint``). When the aggregator's statistics change shape, this module and
``rundata``'s round-trip change with them; nothing downstream does.
"""

from __future__ import annotations

from typing import Any, Optional

from ..rundata import RunData
from .state import RunState


def run_data(state: RunState, *, plain: Optional[dict[str, Any]] = None) -> RunData:
    """The run as the aggregator holds it now (pending frames are computed first). ``plain``:
    :func:`checkpoint_data` of the same moment, when the caller made it already (the final
    checkpoint and the summary then read the very same data)."""
    return RunData.from_checkpoint(plain if plain is not None else state.to_data())


def checkpoint_data(state: RunState) -> dict[str, Any]:
    """What a checkpoint stores: the same data, plain (msgpack-able)."""
    return state.to_data()
