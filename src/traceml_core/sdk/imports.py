"""Run a function right after a module has been imported (a post-import hook), once.

The worker bootstrap must not import torch (or a framework) before the user's script does: a
script may set ``OMP_NUM_THREADS`` or ``CUDA_VISIBLE_DEVICES`` before its ``import torch``, and a
script that never imports a framework must not pay for it. So it registers hooks instead: when
the script imports ``torch``, telemetry starts; when it imports ``transformers.trainer``, the
Trainer callback is added to the framework's default callbacks; and so on.

Mechanism: a finder at the front of ``sys.meta_path`` that, for a watched name only, asks the
other finders for the spec and shadows the loader's ``exec_module`` on that one loader instance
(no proxy object: ``module.__spec__.loader`` keeps its real type). A module already imported when
the hook is registered gets the function at once. Hooks never raise into the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading
from typing import Any, Callable

log = logging.getLogger("traceml")

Hook = Callable[[Any], None]


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.hooks:
            return None
        busy = getattr(self._busy, "names", None)
        if busy is None:
            busy = self._busy.names = set()
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = _find_with_others(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        orig = loader.exec_module
        finder = self

        def exec_module(module: Any) -> None:
            orig(module)
            finder.fire(fullname, module)

        try:
            loader.exec_module = exec_module
        except Exception:   # a loader that refuses attributes: the hook cannot run for it
            pass
        return spec

    def fire(self, name: str, module: Any) -> None:
        for fn in self.hooks.pop(name, []):
            _call(fn, module, name)


def _find_with_others(me: _Finder, fullname: str, path: Any, target: Any) -> Any:
    for finder in sys.meta_path:
        if finder is me:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _call(fn: Hook, module: Any, name: str) -> None:
    try:
        fn(module)
    except Exception as exc:
        log.warning("traceml: setting up for %s failed (%s: %s); training is not affected",
                    name, type(exc).__name__, exc)


_finder = _Finder()


def when_imported(name: str, fn: Hook) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it already is)."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(getattr(mod, "__spec__", None), "_initializing", False) is False:
        _call(fn, mod, name)
        return
    _finder.hooks.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def forget_all() -> None:
    """Remove every pending hook (tests)."""
    _finder.hooks.clear()
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass
