"""The one settings mechanism: pydantic-settings models read from an explicit mapping.

Every value TraceML takes from the environment (the ``TRACEML_*`` launch options, the Slurm
plugin's ``SLURM_*`` variables) is a field of a :class:`EnvSettings` model: pydantic-settings maps
each field to its variable (``env_prefix`` + the field's name, or an alias), types and bounds it
(the bounds come from :mod:`.limits`), and reads it from the mapping given to
:meth:`EnvSettings.from_environ` -- never from ``os.environ`` behind the caller's back, so resolving
a launch stays a pure function of a dict. A bad value becomes one :class:`~.errors.ConfigError`
naming the variable, the value seen, what is allowed and the fix, never a traceback.

pydantic-settings costs about 0.2 s to import, so this module is imported only when a value is
actually resolved (``traceml --help`` never pays it).
"""

from __future__ import annotations

import contextvars
import typing
from typing import Annotated, Any, Callable, ClassVar, Mapping, Optional, TypeVar

from pydantic import AfterValidator, Field, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from .errors import ConfigError, show
from .limits import ALL as LIMITS, Limit

#: the mapping the next model reads (set only for the duration of from_environ)
_ENVIRON: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("traceml_environ", default={})
S = TypeVar("S", bound="EnvSettings")


def bounded(limit: Limit) -> Any:
    """The annotated type of a number within ``limit`` (an int or a finite float)."""
    kind = int if limit.integer else float
    extra: dict[str, Any] = {} if limit.integer else {"allow_inf_nan": False}
    return Annotated[kind, Field(ge=limit.lo, le=limit.hi, json_schema_extra={"limit": limit.name}, **extra)]


def checked(check: Callable[[str], Any]) -> Any:
    """The annotated type of a string that ``check`` accepts (it raises ValueError saying why)."""
    return Annotated[str, AfterValidator(check)]


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``.

    Names match exactly (upper case, as Slurm and we write them); the lookup is done in lower
    case because that is how pydantic-settings matches a prefix case-insensitively.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._given = environ
        super().__init__(settings_cls, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, Optional[str]]:
        cls = self.settings_cls
        keep_blank: frozenset[str] = getattr(cls, "keep_blank", frozenset())
        strip: bool = getattr(cls, "strip_values", False)
        out: dict[str, Optional[str]] = {}
        for name, value in self._given.items():
            if not isinstance(value, str) or name != name.upper():
                continue
            v = value.strip() if strip else value
            if v == "" and name not in keep_blank:
                continue  # a blank variable counts as unset
            out[name.lower()] = value.strip() if strip else value
        return out


class EnvSettings(BaseSettings):
    """Base of every settings model. Subclasses set ``env_prefix`` (or per-field aliases) and
    may override :meth:`fix` (what to tell the user about a bad value of their variables)."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    #: variables whose blank value is kept (and refused by the field), instead of counting as unset
    keep_blank: ClassVar[frozenset[str]] = frozenset()
    #: strip surrounding whitespace from every value before validation
    strip_values: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # type: ignore[override]
        # explicit values first (flags), then the given mapping; never os.environ, .env or secrets
        return (init_settings, _MappingSource(settings_cls, _ENVIRON.get()))

    @classmethod
    def from_environ(cls: type[S], environ: Mapping[str, str], **explicit: Any) -> S:
        """Read the model from ``environ`` (``explicit`` values win); ConfigError on a bad value."""
        token = _ENVIRON.set(environ)
        try:
            return cls(**explicit)
        except ValidationError as exc:
            raise cls.config_error(exc, environ, explicit) from None
        finally:
            _ENVIRON.reset(token)

    # -- names and errors --------------------------------------------------------------------------
    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of ``field``."""
        info = cls.model_fields[field]
        alias = info.validation_alias or info.alias
        if isinstance(alias, str):
            return alias
        return (cls.model_config.get("env_prefix") or "") + field.upper()

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
    """Find the Limit named in the metadata of an (Optional[Annotated[...]]) annotation."""
    for meta in getattr(annotation, "__metadata__", ()):
        extra = getattr(meta, "json_schema_extra", None)
        if isinstance(extra, dict) and "limit" in extra:
            return next((lim for lim in LIMITS if lim.name == extra["limit"]), None)
    for arg in typing.get_args(annotation):
        found = _limit_in(arg)
        if found is not None:
            return found
    return None


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
