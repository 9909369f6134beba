"""Timing wrappers with the wrapped function's own parameter list.

A generic ``def wrapper(*args, **kwargs): return orig(*args, **kwargs)`` packs a tuple and a dict
on every call and unpacks them again; with the caches cold (as they are in the middle of a
training step) that alone was measured at ~0.3-0.4 us per wrapped call, and a traced step wraps
four calls. So for a function whose signature we can read (``model.forward(self, x)``,
``torch.autograd.backward``, ``Optimizer.step(self, closure=None)``) the wrapper is generated with
the same parameters and forwards them one by one. Defaults are forwarded as the very objects the
original would have used, so behaviour is unchanged; anything unusual (no signature, positional-
only parameters with defaults after them, ...) falls back to the generic wrapper.

The generated code is a fixed template (hooks.py) with parameter names taken from the signature;
names are checked to be identifiers, so nothing else from the wrapped function reaches ``exec``.
A function whose signature cannot be forwarded gets the same template with ``*args, **kwargs``.
"""

from __future__ import annotations

import functools
import inspect
import keyword
from typing import Any, Callable, Optional

P = inspect.Parameter


def _forwarding(orig: Callable[..., Any]) -> Optional[tuple[str, str, dict[str, Any]]]:
    """(parameter list, call arguments, defaults namespace) for ``orig``, or None."""
    try:
        sig = inspect.signature(orig)
    except (TypeError, ValueError):
        return None
    params, call, defaults = [], [], {}
    seen_kwonly_marker = False
    for i, p in enumerate(sig.parameters.values()):
        name = p.name
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_tm_"):
            return None
        if p.kind is P.POSITIONAL_ONLY:
            return None          # rare; keep the generic wrapper rather than get '/' placement wrong
        text = name
        if p.default is not P.empty:
            key = f"_tm_d{i}"
            defaults[key] = p.default
            text = f"{name}={key}"
        if p.kind is P.POSITIONAL_OR_KEYWORD:
            params.append(text)
            call.append(name)
        elif p.kind is P.VAR_POSITIONAL:
            params.append(f"*{name}")
            call.append(f"*{name}")
            seen_kwonly_marker = True
        elif p.kind is P.KEYWORD_ONLY:
            if not seen_kwonly_marker:
                params.append("*")
                seen_kwonly_marker = True
            params.append(text)
            call.append(f"{name}={name}")
        elif p.kind is P.VAR_KEYWORD:
            params.append(f"**{name}")
            call.append(f"**{name}")
    return ", ".join(params), ", ".join(call), defaults


def build(
    orig: Callable[..., Any],
    template: str,
    names: dict[str, Any],
    state: Any,
    *,
    method: bool = False,
    specialise: bool = True,
) -> Callable[..., Any]:
    """Compile ``template`` (with ``{params}``, ``{call}``, ``{self}`` and ``{first}`` holes)
    around ``orig``.

    The wrapper's globals are ``names``; ``_tm_orig`` (the wrapped function) and ``_tm_t``
    (``state``) are its closure. ``method``: the template needs the first parameter (``self``)
    by name -- its actual name is substituted for ``{self}``. Without a readable signature (or
    with ``specialise=False``: the benchmarks' comparison) the same template is compiled with
    ``*args, **kwargs``.
    """
    fw = _forwarding(orig) if specialise else None
    if fw is not None:
        params, call, defaults = fw
        names_in = [x.split("=")[0] for x in params.split(", ") if x and x != "*"]
        if method and (not names_in or params.startswith("*")):
            fw = None
        else:
            self_name = names_in[0] if method else ""
            first = _first(names_in[1:] if method else names_in)
    if fw is None:
        params = call = "_tm_self, *_tm_args, **_tm_kwargs" if method else "*_tm_args, **_tm_kwargs"
        defaults, self_name = {}, "_tm_self"
        first = "(_tm_args[0] if _tm_args else next(iter(_tm_kwargs.values()), None))"
    try:
        wrapper = _compile(orig, template.format(params=params, call=call, self=self_name, first=first),
                           names, state, defaults)
    except SyntaxError:
        return build(orig, template, names, state, method=method, specialise=False)
    return functools.wraps(orig)(wrapper)


def _first(names: list[str]) -> str:
    """The template's ``{first}``: an expression for the call's first argument after ``self``
    (the batch a model's forward is given: worksample.py), from the wrapper's parameter names
    (``*args`` as written, ``**kwargs`` as written)."""
    if not names:
        return "None"
    n = names[0]
    if n.startswith("**"):
        return f"next(iter({n[2:]}.values()), None)"
    if n.startswith("*"):
        return f"({n[1:]}[0] if {n[1:]} else None)"
    return n


def _compile(orig: Callable[..., Any], body: str, names: dict[str, Any], state: Any,
             defaults: dict[str, Any]) -> Callable[..., Any]:
    src = "def _tm_factory(_tm_orig, _tm_t, {dnames}):\n{body}\n    return _tm_wrapper\n".format(
        dnames=", ".join(defaults) or "_tm_unused=None", body=body)
    ns: dict[str, Any] = {}
    code = compile(src, f"<traceml wrapper of {getattr(orig, '__qualname__', orig)!s}>", "exec")
    exec(code, dict(names), ns)          # defines _tm_factory only (in ns)
    return ns["_tm_factory"](orig, state, **defaults)
