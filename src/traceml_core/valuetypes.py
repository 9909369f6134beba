"""The kinds of value TraceML reads from a flag or a variable, as pydantic-core schemas.

A launch option (:mod:`.options`) is a number within a :class:`~.limits.Limit`, a string a check
function accepts, or on/off; the Slurm plugin's variables are numbers within limits and strings.
Each kind's rule is written once, here, as a pydantic-core schema:

- the settings models (:mod:`.settings`, pydantic) use it through the :class:`Bounded` and
  :class:`Checked` markers in their annotations;
- the option table validates a flag's or a ``TRACEML_*`` variable's value with it directly
  (:func:`validate`), which needs only pydantic-core: ~15 ms to import, against ~100 ms for
  pydantic and a model, so ``traceml run --print-config --nproc-per-node=4`` stays fast (issue 26).

The parsing rules are pydantic's own (pydantic compiles every field to such a schema), and so
are the errors, which :func:`problem` puts into words.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from .limits import Limit

#: what a value is: a bounded number (a Limit), a checked string (a function), or on/off (bool)
Kind = Union[Limit, Callable[[str], Any], type]


def schema(kind: Kind) -> Any:
    """The pydantic-core schema of one kind of value."""
    from pydantic_core import core_schema as cs

    if isinstance(kind, Limit):
        if kind.integer:
            return cs.int_schema(ge=kind.lo, le=kind.hi)
        return cs.float_schema(ge=kind.lo, le=kind.hi, allow_inf_nan=False)
    if kind is bool:
        return cs.bool_schema()
    return cs.no_info_after_validator_function(kind, cs.str_schema())  # type: ignore[arg-type]


@functools.lru_cache(maxsize=None)
def _validator(kind: Kind) -> Any:
    from pydantic_core import SchemaValidator

    return SchemaValidator(schema(kind))


def validate(kind: Kind, text: Any) -> Any:
    """``text`` as a value of ``kind``; ValueError says what is wrong (``is not a whole number
    between 1 and 65,536``). Each kind's validator is built on first use."""
    from pydantic_core import ValidationError

    try:
        return _validator(kind).validate_python(text)
    except ValidationError as exc:
        raise ValueError(problem(exc.errors()[0], kind if isinstance(kind, Limit) else None)) from None


@dataclass(frozen=True)
class Bounded:
    """Annotation marker: a number within ``limit`` (``Annotated[int, Bounded(limit)]``)."""

    limit: Limit

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return schema(self.limit)


@dataclass(frozen=True)
class Checked:
    """Annotation marker: a string that ``check`` accepts (it raises ValueError saying why)."""

    check: Callable[[str], Any]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return schema(self.check)


def problem(err: Mapping[str, Any], limit: Optional[Limit] = None) -> str:
    """What is wrong, in words, from one pydantic error (``is not a whole number``, ...)."""
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "is invalid")))
    if kind in ("int_parsing", "int_from_float", "int_type", "int_parsing_size"):
        return "is not a whole number" + (f" {limit.text()}" if limit else "")
    if kind in ("float_parsing", "float_type"):
        return "is not a number" + (f" {limit.text()}" if limit else "")
    if kind in ("bool_parsing", "bool_type"):
        return "must be on or off (or 1/0)"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than", "finite_number"):
        if limit is not None:
            try:
                number = int(err["input"]) if limit.integer else float(err["input"])
                return limit.problem(number) or f"must be {limit.text()}"
            except (KeyError, TypeError, ValueError):
                return f"must be {limit.text()}"
        return "is not a finite number" if kind == "finite_number" else "is out of range"
    if kind == "string_too_long":
        return f"is too long (at most {ctx.get('max_length')} characters)"
    return "is invalid"
