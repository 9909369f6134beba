"""Generated timing wrappers behave exactly like the functions they wrap, for any signature."""

from __future__ import annotations

import inspect

import pytest

from traceml_core.sdk import hooks
from traceml_core.sdk.recorder import C_BWD, C_FWD, C_OPT, StepRecorder
from traceml_core.sdk.tracer import Tracer


class Model:
    """Stands in for an nn.Module class: the forward wrapper only needs ``self``."""


def forwards():
    def plain(self, x):
        return ("plain", x)

    def defaults(self, x, scale=2, *, mode="a"):
        return ("defaults", x, scale, mode)

    def varargs(self, *inputs, **kwargs):
        return ("varargs", inputs, kwargs)

    def shadowing(self, r, out, t0, gpu, ev, id, REC=None):   # names our wrapper must not clobber
        return ("shadowing", r, out, t0, gpu, ev, id, REC)

    def posonly(self, x, /, y=1):
        return ("posonly", x, y)

    return [plain, defaults, varargs, shadowing, posonly]


CALLS = {
    "plain": [((1,), {}), ((), {"x": 3})],
    "defaults": [((1,), {}), ((1, 5), {"mode": "b"}), ((), {"x": 0, "scale": 9})],
    "varargs": [((), {}), ((1, 2), {"k": 3})],
    "shadowing": [((1, 2, 3, 4, 5, 6), {"REC": 7}), ((1, 2, 3, 4, 5, 6), {})],
    "posonly": [((1,), {}), ((1,), {"y": 4})],
}


@pytest.mark.parametrize("fn", forwards(), ids=lambda f: f.__name__)
def test_forward_wrapper_is_transparent_and_timed(fn):
    t = Tracer(StepRecorder())
    m = Model()
    t.model_id = id(m)
    t.models.add(id(m))
    t.time_forward(True)
    wrapped = hooks.forward(fn, t)
    assert inspect.signature(wrapped) == inspect.signature(fn)
    for args, kwargs in CALLS[fn.__name__]:
        assert wrapped(m, *args, **kwargs) == fn(m, *args, **kwargs)
        with t.step:
            assert wrapped(m, *args, **kwargs) == fn(m, *args, **kwargs)
        assert t.vals[C_FWD] > 0
    too_many = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    try:
        expected = fn(m, *too_many)
    except TypeError:
        with pytest.raises(TypeError):
            wrapped(m, *too_many)
    else:
        assert wrapped(m, *too_many) == expected


def test_backward_and_step_wrappers_forward_every_argument():
    seen = []

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
        seen.append((tensors, grad_tensors, retain_graph, create_graph, inputs))

    def step(self, closure=None):
        seen.append(("step", self, closure))
        return closure() if closure else None

    t = Tracer(StepRecorder())
    b = hooks.backward(backward, t)
    s = hooks.step(step, t)
    with t.step:
        b("loss", None, True, False, inputs=["w"])
        assert s("opt", lambda: 42) == 42
    assert seen == [("loss", None, True, False, ["w"]), ("step", "opt", seen[1][2])]
    assert t.vals[C_BWD] > 0 and t.vals[C_OPT] > 0
