"""``python -m traceml_core``: the ``traceml`` command, for an environment whose ``bin`` is not on
``PATH`` (``python -m traceml_core run train.py`` is ``traceml run train.py``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
