"""Steps inferred from optimizer steps, for a script that never calls ``trace_step``.

Started by the worker bootstrap (bootstrap.py) under ``traceml run``. The backward and optimizer
wrappers are regenerated in their inference variant (hotpath.py, ``#I`` lines), and then:

* a step **ends** when ``Optimizer.step()`` returns, and the next one begins at that instant, so
  the steps tile the training time: one step = one optimizer step, everything from the end of one
  to the end of the next (the input fetch, forward, backward, optimizer, and whatever else the
  loop does: logging, ``zero_grad``, an evaluation every N steps). Gradient accumulation folds in
  by itself: the micro-batches' backward passes all fall inside the one step, and their number is
  counted and reported;
* the first step begins at the first backward or optimizer step (the input fetch before it is
  credited as usual), so it is partial; it is a warm-up step, which the summary leaves out;
* with several optimizers (a GAN's generator and discriminator), the one that stepped first ends
  steps and the others' time is in the step;
* phases: ``input`` is DataLoader (or ``wrap_dataloader``) fetch time, ``backward`` every
  ``torch.autograd.backward``, ``optimizer`` the optimizer steps; ``forward`` is timed only for
  ``DistributedDataParallel`` models (registered as they are built: the wrapper that the usual
  DDP script calls), otherwise it is "not measured" and shows inside the rest of the step;
* the step left open after the last optimizer step (evaluation, saving at the end) is not a step
  and is never recorded.

The first ``trace_step`` in the script, or a framework integration taking over (source.py), stops
inference: the wrappers go back to their plain variant.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Any, Optional

from . import hotpath, source

log = logging.getLogger("traceml")

#: the owner token of inferred steps in source.py
OWNER = object()
#: after this many inferred steps the observed backward passes per step are announced once
#: (also at shutdown); enough for the warm-up to be over
ANNOUNCE_AFTER = 8
_MAX_HISTOGRAM = 64


class _Inference:
    def __init__(self) -> None:
        self.on = False
        self.primary: Optional[int] = None
        self.steps = 0
        self.backward: Counter[int] = Counter()
        self.models: set[int] = set()
        self.ddp_wrapped = False


_inf = _Inference()


def active() -> bool:
    return _inf.on


def start() -> bool:
    """Infer steps from now on (no-op when tracing is off or something else owns the steps)."""
    from . import api, patches

    if hotpath.REC is None or _inf.on or source.owner() is not None:
        return False
    cur = source.current()
    if cur is not None and cur.source == "trace_step":
        return False
    hotpath._tm_infer_open = _open        # type: ignore[attr-defined]
    hotpath._tm_infer_boundary = _boundary  # type: ignore[attr-defined]
    patches.set_inference(True)
    _wrap_ddp()
    _inf.on = True
    source._state.owner = OWNER
    api.hand_steps_to_trace_step(True)
    source.at_shutdown(_final_notice)
    source.announce(source.StepSource("inferred", forward=False))
    return True


def stop() -> None:
    """Back to plain wrappers; an inferred step still open is dropped (never recorded)."""
    from . import patches

    if not _inf.on:
        return
    _inf.on = False
    r = hotpath.REC
    if r is not None:
        r.abandon()
        for key in _inf.models:   # forward timing was ours; the new owner decides its own
            r.models.discard(key)
            if r.model_id == key:
                r.model_id = 0
        if not r.models:
            r.fwd0 = -1
    _inf.models.clear()
    patches.set_inference(False)
    if source.owner() is OWNER:
        source._state.owner = None


def _open() -> None:
    from . import api

    r = hotpath.REC
    if r is None or r.active:
        return
    api.step_context().__enter__()
    r.nbwd = 0


def _boundary(optimizer: Any) -> None:
    from . import api

    r = hotpath.REC
    if r is None or not r.active:
        return
    key = id(optimizer)
    if _inf.primary is None:
        _inf.primary = key
    elif key != _inf.primary:
        return
    ctx = api.step_context()
    ctx.__exit__(None, None, None)
    n = r.nbwd
    r.nbwd = 0
    if n in _inf.backward or len(_inf.backward) < _MAX_HISTOGRAM:
        _inf.backward[n] += 1
    _inf.steps += 1
    ctx.__enter__()
    if _inf.steps == ANNOUNCE_AFTER:
        _notice()


def _notice() -> None:
    if not _inf.backward:
        return
    (common, count), = _inf.backward.most_common(1)
    source.update(backward_per_step=common, backward_steps=[count, sum(_inf.backward.values())],
                  forward=bool(_inf.models))


def _final_notice() -> None:
    if _inf.on:
        _notice()


# ---- forward timing for DDP models -----------------------------------------------------------

def _wrap_ddp() -> None:
    """Register each DistributedDataParallel model for forward timing as it is built."""
    if _inf.ddp_wrapped:
        return
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except Exception:
        return
    orig = DDP.__init__

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if _inf.on:
            try:
                register(self)
            except Exception:
                pass

    __init__._traceml_infer = True  # type: ignore[attr-defined]
    DDP.__init__ = __init__  # type: ignore[method-assign]
    _inf.ddp_wrapped = True


def register(model: Any) -> None:
    """Time ``model``'s forward in inferred steps (DDP models, Accelerate's prepared models)."""
    from . import api

    r = hotpath.REC
    if r is None or not _inf.on:
        return
    api._register_model(model)
    _inf.models.add(id(model))
    if _inf.steps >= ANNOUNCE_AFTER or len(_inf.models) == 1:
        source.update(forward=True)


def reset_for_tests() -> None:
    global _inf
    ddp = _inf.ddp_wrapped
    _inf = _Inference()
    _inf.ddp_wrapped = ddp
