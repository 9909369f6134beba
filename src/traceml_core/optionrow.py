"""One launch option (a row of the option table): its key, its kind of value, its default, its help.

A row gives a flag (``--key-name``), a ``TRACEML_<KEY>`` variable and a setting at once
(:mod:`.options` reads them; ``--print-config``, ``--help`` and docs/configuration.md are made from
the rows). Core's rows are in :data:`traceml_core.options.OPTIONS`; an output
(:mod:`traceml_core.exporters.output`) brings the rows of its own settings, so a destination never
reads the environment itself. This module is the seam both use, and imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from . import limits
from .limits import Limit
from .valuetypes import Kind


def nonempty(text: str) -> str:
    value = str(text).strip()
    if not value:
        raise ValueError("is empty")
    return value


def path(text: str) -> str:
    value = nonempty(text)
    if "\0" in value:
        raise ValueError("contains a NUL character")
    if len(value) > limits.PATH_CHARS.hi:
        raise ValueError(f"is longer than {limits.PATH_CHARS.hi} characters ({limits.PATH_CHARS.why})")
    return value


@dataclass(frozen=True)
class Option:
    """One launch option: its key, its kind of value, its default and its help."""

    key: str
    kind: Kind
    default: Any
    help: str
    metavar: str = ""
    #: shown in docs/--help when the default is computed rather than fixed
    default_doc: str = ""
    #: a variable of the destination's own library that sets the same thing (``WANDB_PROJECT``),
    #: read after the flag and the ``TRACEML_*`` variable: a user's existing setup keeps working
    also_env: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return "TRACEML_" + self.key.upper()

    @property
    def limit(self) -> Optional[Limit]:
        return self.kind if isinstance(self.kind, Limit) else None

    def describe_default(self) -> str:
        return str(self.default_doc or self.default)

    def parse(self, text: str) -> Any:
        """Validate one raw value (a flag's or a variable's); ValueError says what is wrong.
        The rule is the kind's (:mod:`.valuetypes`); it needs pydantic-core, not pydantic."""
        from .valuetypes import validate

        return validate(self.kind, text)
