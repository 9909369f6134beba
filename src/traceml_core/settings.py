"""The one settings mechanism: typed models of environment variables, read from an explicit mapping.

Every value TraceML takes from the environment (the ``TRACEML_*`` launch options, the Slurm
plugin's ``SLURM_*`` variables) is a field of an :class:`EnvSettings` model: each field is read from
its variable (``env_prefix`` + the field's name in upper case, or an alias), typed and bounded by
pydantic (each kind of value's rule is in :mod:`.valuetypes`, the bounds in :mod:`.limits`), and read from the mapping given to
:meth:`EnvSettings.from_environ` -- never from ``os.environ`` behind the caller's back, so resolving
a launch stays a pure function of a dict. A bad value becomes one :class:`~.errors.ConfigError`
naming the variable, the value seen, what is allowed and the fix, never a traceback.

Why not pydantic-settings: of it we used only the field-to-variable naming; its own sources
(``os.environ``, dotenv, secrets) were all switched off, and importing it cost ~0.1 s of every
``traceml run --print-config`` (issue 26). The naming is :meth:`EnvSettings.variable`, below.
pydantic itself is imported only when a value is actually resolved (``traceml --help`` never
pays it).
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Callable, ClassVar, Mapping, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError, show
from .limits import Limit
from .valuetypes import Bounded, Checked, problem

__all__ = ["EnvSettings", "SettingsConfigDict", "bounded", "checked", "problem"]

S = TypeVar("S", bound="EnvSettings")


class SettingsConfigDict(ConfigDict, total=False):
    """pydantic's model config plus ``env_prefix``: the variable of field ``f`` is
    ``env_prefix + F`` unless the field has an alias."""

    env_prefix: str


def bounded(limit: Limit) -> Any:
    """The annotated type of a number within ``limit`` (an int or a finite float)."""
    return Annotated[int if limit.integer else float, Bounded(limit)]


def checked(check: Callable[[str], Any]) -> Any:
    """The annotated type of a string that ``check`` accepts (it raises ValueError saying why)."""
    return Annotated[str, Checked(check)]


class EnvSettings(BaseModel):
    """Base of every settings model. Subclasses set ``env_prefix`` (or per-field aliases) and
    may override :meth:`fix` (what to tell the user about a bad value of their variables)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    #: variables whose blank value is kept (and refused by the field), instead of counting as unset
    keep_blank: ClassVar[frozenset[str]] = frozenset()
    #: strip surrounding whitespace from every value before validation
    strip_values: ClassVar[bool] = False

    @classmethod
    def from_environ(cls: type[S], environ: Mapping[str, str], **explicit: Any) -> S:
        """Read the model from ``environ`` (``explicit`` values, by field name, win); ConfigError
        on a bad value. Names match exactly (upper case, as Slurm and we write them); a blank
        value counts as unset unless its variable is in ``keep_blank``."""
        data: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if name in explicit:
                continue
            var = cls.variable(name)
            value = environ.get(var)
            if not isinstance(value, str):
                continue
            if cls.strip_values:
                value = value.strip()
            if value == "" and var not in cls.keep_blank:
                continue
            data[info.alias or name] = value
        for name, value in explicit.items():
            info = cls.model_fields.get(name)
            data[(info.alias if info is not None else None) or name] = value
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise cls.config_error(exc, environ, explicit) from None

    # -- names and errors --------------------------------------------------------------------------
    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of ``field``."""
        info = cls.model_fields[field]
        if info.alias:
            return info.alias
        return str(cls.model_config.get("env_prefix") or "") + field.upper()

    @classmethod
    def field_of(cls, name: str) -> Optional[str]:
        """The field read from variable (or field name) ``name``."""
        if name in cls.model_fields:
            return name
        for f in cls.model_fields:
            if cls.variable(f) == name:
                return f
        return None

    @classmethod
    def fix(cls, field: str) -> str:
        return f"Fix or unset {cls.variable(field)}."

    @classmethod
    def config_error(cls, exc: ValidationError, environ: Mapping[str, str],
                     explicit: Mapping[str, Any]) -> ConfigError:
        err = exc.errors()[0]
        loc = str(err["loc"][0]) if err.get("loc") else ""
        field = cls.field_of(loc) or loc
        if field in explicit:
            name, value = cls.flag(field), explicit[field]
        else:
            name = cls.variable(field) if field in cls.model_fields else loc
            value = environ.get(name, err.get("input"))
        shown = value.strip() if isinstance(value, str) and cls.strip_values else value
        return ConfigError(f"{name}={show(shown)} {problem(err, cls.limit(field))}. {cls.fix(field)}",
                           variable=name)

    @classmethod
    def limit(cls, field: str) -> Optional[Limit]:
        """The :mod:`.limits` entry that bounds ``field`` (declared with :func:`bounded`), if any."""
        info = cls.model_fields.get(field)
        return _limit_in(info.annotation) if info is not None else None


def _limit_in(annotation: Any) -> Optional[Limit]:
    """Find the Limit of a :class:`~.valuetypes.Bounded` in an (Optional[Annotated[...]]) annotation."""
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, Bounded):
            return meta.limit
    for arg in typing.get_args(annotation):
        found = _limit_in(arg)
        if found is not None:
            return found
    return None
