"""One codec for every typed record: pydantic's ``TypeAdapter`` over the dataclasses, driven by
their annotations.

A record's fields are declared once, on its dataclass (the run data, the rank facts, the summary
document, the goodput ledger, the live snapshot). :func:`encode` writes a record as plain data in
the fields' order (checkpoints pack it with msgpack, ``final_summary.json`` is it as JSON);
:func:`decode` reads it back, and a field that older data lacks takes its declared default. No
record writes its own ``to_*``/``from_*``.

What a plain field cannot say, its annotation does, with the markers below (plain objects:
pydantic is imported on the codec's first use, so a rank, the launcher and ``--help``, which
import the records, never pay its ~0.1 s):

``Annotated[X, OMIT]`` / ``Omit(v)``
    the field is not written while it is None (``v``): a key that older files never had;
``Annotated[R, FLAT]``
    record ``R``'s keys are written inline, beside its holder's own (and read back from there);
``Annotated[dict[str, Any], REST]``
    the keys its holder does not declare (a frame's newer fields, kept for the round trip);
``Annotated[dict[str, X], PAIRS]``
    a mapping written as ``[[key, value], ...]`` (the wire's form of a launcher's lifecycle);
``Annotated[X, Convert(read, write)]``
    another form in the file (milliseconds kept, seconds written);
``Annotated[X, SKIP]``
    never written: its holder sets it (a GPU's node is the node it is listed under);
``Annotated[X, Key("name")]``
    written and read as ``name``;
:class:`derived`
    a property also written to the file (after a given field), never read back.

A record with FLAT, REST or derived values, or whose older files had another shape (its
``_upgrade``), derives from :class:`Record`. ``Number`` is an int or a float read back as it was
written (a ``float`` field would read 3 back as 3.0, and the file would change).
"""

from __future__ import annotations

import functools
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Optional, TypeVar, Union

T = TypeVar("T")

#: an int or a float, kept as it came (bytes of memory next to a mean, say)
Number = Union[int, float]


class Omit:
    """``Annotated[X, Omit(v)]``: the field is not written while it equals ``v``."""

    __slots__ = ("value",)

    def __init__(self, value: Any = None) -> None:
        self.value = value


class _Mark:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Key:
    """``Annotated[X, Key("name")]``: the field's key in the file is ``name``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


OMIT = Omit(None)
FLAT = _Mark("FLAT")
REST = _Mark("REST")
SKIP = _Mark("SKIP")


class Convert:
    """``Annotated[X, Convert(read, write)]``: ``write`` makes the file's form of a value, ``read``
    takes it back (each also gets None where X may be None)."""

    __slots__ = ("read", "write")

    def __init__(self, read: Callable[[Any], Any], write: Callable[[Any], Any]) -> None:
        self.read, self.write = read, write

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema as cs

        return cs.no_info_before_validator_function(
            self.read, handler(source), serialization=cs.plain_serializer_function_ser_schema(self.write))


#: a mapping written as ``[[key, value], ...]`` (order kept); a mapping is read as well
PAIRS = Convert(lambda v: dict(v) if isinstance(v, (list, tuple)) else v, lambda d: [[k, v] for k, v in d.items()])


class derived(property):
    """A property that is also written, after the field ``after`` (None: last); never read back."""

    after: Optional[str] = None


def written_after(after: Optional[str] = None) -> Callable[[Callable[[Any], Any]], derived]:
    """``@written_after("source")`` over a property's function: a :class:`derived` value."""
    def wrap(fn: Callable[[Any], Any]) -> derived:
        d = derived(fn)
        d.after = after
        return d
    return wrap


class _Plan:
    """What the codec does for one :class:`Record` class beyond its fields."""

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        meta = {f.name: _meta(hints[f.name]) for f in fields(cls)}
        self.cls = cls
        self.flat = tuple(n for n, m in meta.items() if FLAT in m)
        self.rest = next((n for n, m in meta.items() if REST in m), None)
        self.skip = frozenset(n for n, m in meta.items() if SKIP in m)
        self.omit = {n: o.value for n, m in meta.items() for o in m if isinstance(o, Omit)}
        self.key = {n: k.name for n, m in meta.items() for k in m if isinstance(k, Key)}
        self.names = frozenset(self.key.get(n, n) for n in meta)
        self.derived = _derived(cls)
        #: keys written but not the holder's rest: a flat member's, and derived values
        self.inner = frozenset([n for n, _ in self.derived] + [
            k for n in self.flat for k in _written(typing.get_args(hints[n])[0])])
        self.reshape = bool(self.flat or self.rest or self.derived)

    def read(self, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if self.cls._upgrade is not None:  # type: ignore[attr-defined]
            data = self.cls._upgrade(data)  # type: ignore[attr-defined]
        if not (self.flat or self.rest):
            return data
        out = {k: v for k, v in data.items() if k in self.names}
        for name in self.flat:
            out[name] = data
        if self.rest:
            out[self.rest] = {k: v for k, v in data.items()
                              if k not in self.names and k not in self.inner}
        return out

    def write(self, value: Any, handler: Callable[[Any], Any]) -> Any:
        d = handler(value)
        if not self.reshape:
            return d
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k in self.flat or k == self.rest:
                out.update(v)
            else:
                out[k] = v
            for name, after in self.derived:
                if after == k:
                    out[name] = getattr(value, name)
        for name, after in self.derived:
            if after is None:
                out[name] = getattr(value, name)
        return out

    def schema(self, schema: dict[str, Any]) -> Any:
        """The dataclass's schema with the fields' OMIT and SKIP applied, read and written by
        :meth:`read` and :meth:`write`."""
        from pydantic_core import core_schema as cs

        for f in schema["schema"]["fields"]:
            if f["name"] in self.key:
                f["serialization_alias"] = f["validation_alias"] = self.key[f["name"]]
            if f["name"] in self.skip:
                f["serialization_exclude"] = True
            elif f["name"] in self.omit:
                f["serialization_exclude_if"] = functools.partial(_equal, self.omit[f["name"]])
        schema["serialization"] = cs.wrap_serializer_function_ser_schema(self.write)
        return cs.no_info_before_validator_function(self.read, schema)


def _equal(a: Any, b: Any) -> bool:
    return a is b if a is None else a == b


def _meta(hint: Any) -> tuple[Any, ...]:
    return getattr(hint, "__metadata__", ())


def _derived(cls: type) -> list[tuple[str, Optional[str]]]:
    return [(n, d.after) for k in reversed(cls.__mro__) for n, d in vars(k).items() if isinstance(d, derived)]


def _written(cls: Any) -> list[str]:
    """The keys a record writes: its fields' (or their :class:`Key`) and its derived values."""
    if not is_dataclass(cls):
        return []
    hints = typing.get_type_hints(cls, include_extras=True)
    return [next((k.name for k in _meta(hints[f.name]) if isinstance(k, Key)), f.name) for f in fields(cls)] + [
        n for n, _ in _derived(cls)]


class Record:
    """Base of a record whose file form needs more than its fields (see the module's docstring).
    A class whose older files had another shape sets ``_upgrade``: a classmethod from the data
    as read to the current shape."""

    __slots__ = ()
    _upgrade: Any = None

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return _Plan(cls).schema(handler(source))


@functools.lru_cache(maxsize=None)
def adapter(kind: Any) -> Any:
    """The codec of one record type (built once: pydantic compiles it)."""
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def encode(value: Any) -> Any:
    """A record as plain data (dicts, lists, numbers, strings, bytes), its fields in order."""
    return adapter(type(value)).dump_python(value, by_alias=True)


def decode(kind: type[T], data: Any) -> T:
    """A record of ``kind`` from plain data; pydantic's ``ValidationError`` (a ``ValueError``)
    when it is not one."""
    return adapter(kind).validate_python(data)
