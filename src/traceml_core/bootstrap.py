"""The worker bootstrap: what ``traceml run`` starts in each worker in place of the bare script.

``python -m traceml_core.bootstrap SCRIPT ARGS...`` (or ``-m MODULE ARGS...``) runs the
user's script exactly as ``python SCRIPT ARGS...`` would (``__name__ == "__main__"``, ``sys.argv``,
``sys.path[0]`` the script's folder, ``__main__`` its module so pickling works, its exit status
and traceback), after arranging two things for a script that does not call traceml itself:

* when the script imports ``torch``, ``traceml.init()`` runs (so every rank joins the run even
  if it never calls traceml), and, unless ``--auto-steps off``, steps are found without code
  changes: from the framework's own hooks where the script trains with Lightning, the Hugging
  Face ``Trainer`` or Accelerate (``traceml_core.integrations``), else inferred from optimizer
  steps (sdk/inference.py);
* nothing is imported before the script imports it (hooks wait for the import: sdk/imports.py).

It sits above both the SDK and the integrations (it arranges one and starts the other), so
neither needs to import the other's set-up.

A script that calls ``traceml.init()``/``trace_step`` itself is unaffected: init() is idempotent
and the first ``trace_step`` takes the step boundaries over.

Without run info (started by hand) it only runs the script.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Optional

from .runinfo import RunInfo

USAGE = "usage: python -m traceml_core.bootstrap (SCRIPT | -m MODULE) [ARGS...]"


def _start_telemetry(auto_steps: bool, _torch: Any) -> None:
    from .sdk import api
    from .sdk.tracer import TRACER

    def then(active: bool) -> None:
        if active and auto_steps:
            TRACER.start_inference()

    if api.init_running_here():
        # the script called traceml.init() before importing torch, and init's own import of
        # torch fired this hook: that init (with the script's arguments) does the set-up, and
        # step inference starts once it has finished
        api.after_init(then)
        return
    then(api.init())


def prepare(info: Optional[RunInfo]) -> None:
    """Register the import hooks (no import of torch or a framework here)."""
    if info is None:
        return
    import functools

    from .sdk import imports

    auto_steps = bool(getattr(info, "auto_steps", True))
    imports.when_imported("torch", functools.partial(_start_telemetry, auto_steps))
    if auto_steps:
        from .integrations import zero_code

        zero_code.install()


#: frames of the bootstrap itself and of runpy: not the user's, so not in the traceback they see
_OWN_FILES = (os.path.abspath(__file__), runpy.__file__ and os.path.abspath(runpy.__file__), "<frozen runpy>")


def user_traceback(tb: Any) -> Any:
    """The traceback from the user's script down: the bootstrap's and runpy's frames left out,
    so an error reads exactly as ``python SCRIPT`` would print it."""
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def write_error_file(exc: BaseException, tb: Any) -> None:
    """torchrun's record of this worker (``TORCHELASTIC_ERROR_FILE``, which torchrun reads when
    the worker fails) gets Python's own error: the last line of the traceback, then the
    traceback itself. The launcher passes torchrun's records on, so the summary can name the
    error of a rank that failed before TraceML could report anything (an import error above
    ``import torch``)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    import json
    import time
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, tb))
    last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    data = {"message": {"message": last[-1] if last else type(exc).__name__,   # torchrun's format
                        "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    prepare(RunInfo.from_env(os.environ))
    try:
        if argv[0] == "-m":
            module, rest = argv[1], argv[2:]
            sys.argv = [module, *rest]     # runpy sets argv[0] to the module's file
            # (sys.path[0] is already the working directory, as for `python -m MODULE`)
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            return
        script, rest = argv[0], argv[1:]
        sys.argv = [script, *rest]
        # as `python script.py`: the script's folder first, not the working directory
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        # (its file name absolute, as `python SCRIPT` makes ``__file__`` and its tracebacks)
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # as the interpreter would: print the traceback (through sys.excepthook, which TraceML's
        # exception hook wraps once init() ran) and exit with status 1; only from the user's
        # script down, and torchrun's record of the worker gets the error too
        tb = user_traceback(exc.__traceback__)
        write_error_file(exc, tb)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
