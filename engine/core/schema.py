"""The record contract of ``engine/core/records.py``, read as data by a reader of records from
outside (a recording anyone may hand the teacher): ``check(value, tp, where)`` checks every field
against its type and ``Annotated`` bound, requires the required ones, fills a ``Default`` in and
drops fields the contract does not name; it raises :class:`Invalid`. Each type's check is made
once (``checker``): a recording holds ~60,000 records. ``engine/core/schema_export.py`` writes the
same contract out for the browser and the docs.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, NotRequired, Union, get_args, get_origin

from engine.core.records import Default, Range, Text

MAX_TEXT = 300  # a plain string's length (labels, errors, event words)
MAX_NUMBER = 1e15  # a number of a sane size
NAME = re.compile(Text().pattern)  # an event's keys


class Invalid(ValueError):
    """``where`` is not what the contract says: ``message`` names the field and what it must be."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _shown(got: object) -> str:
    text = repr(got)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(where: str, want: str, got: object) -> Invalid:
    return Invalid(f"{where} must be {want}, got {_shown(got)}")


@functools.cache
def fields(td: type) -> dict[str, tuple[Any, bool]]:
    """A TypedDict's fields: name -> (type, required). ``NotRequired`` is read off the hints
    (``__required_keys__`` cannot see it through ``from __future__ import annotations``)."""
    out = {}
    for name, tp in typing.get_type_hints(td, include_extras=True).items():
        optional = get_origin(tp) is NotRequired
        out[name] = (get_args(tp)[0] if optional else tp, not optional)
    return out


def split_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[base, *meta]`` -> (base, meta); any other type -> (it, ())."""
    if get_origin(tp) is Annotated:
        base, *meta = get_args(tp)
        inner, more = split_annotated(base)
        return inner, (*more, *meta)
    return tp, ()


def marker(meta: tuple[Any, ...], kind: type) -> Any:
    return next((m for m in meta if isinstance(m, kind)), None)


def nullable(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(get_args(tp)):
            return args[0], True
    return tp, False


def is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__")


# -- checking ------------------------------------------------------------------------------------
def check(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against ``tp``; the value as the contract keeps it."""
    return checker(tp)(value, where)


Check = Callable[[Any, str], Any]


@functools.cache
def checker(tp: Any) -> Check:
    """``tp``'s check as one function, made once per type (a recording has ~60,000 records)."""
    tp, none = nullable(tp)
    inner = _made(tp, none)
    if not none:
        return inner
    return lambda v, where: None if v is None else inner(v, where)


def _made(tp: Any, none: bool) -> Check:
    base, meta = split_annotated(tp)
    if is_typeddict(base):
        return _dict_checker(base)
    if get_origin(base) is Literal:
        options = get_args(base)
        want = "one of " + ", ".join(options)

        def one_of(v: Any, where: str) -> Any:
            if v not in options:
                raise _bad(where, want, v)
            return v

        return one_of
    if get_origin(base) is list:
        return _list_checker(get_args(base)[0], list_bound(meta))
    if get_origin(base) is dict and "event" in meta:
        return _event
    if get_origin(base) is dict:
        return _ids_checker(checker(get_args(base)[1]))
    return _scalar_checker(base, meta, " or null" if none else "")


def list_bound(meta: tuple[Any, ...]) -> int:
    """A list's most items: its ``Range`` or 100,000."""
    return (marker(meta, Range) or Range(0, 100_000)).hi


def _list_checker(item_tp: Any, most: int) -> Check:
    item = checker(item_tp)

    def a_list(v: Any, where: str) -> list:
        if not isinstance(v, list) or len(v) > most:
            raise _bad(where, f"a list of at most {most} items", v)
        return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]

    return a_list


def _ids_checker(item: Check) -> Check:
    def by_id(v: Any, where: str) -> dict:  # request id -> ...; JSON keeps the keys as strings
        if not isinstance(v, dict) or not all(isinstance(k, str) and k.isdigit() for k in v):
            raise _bad(where, "an object of request id -> count", v)
        return {k: item(x, f"{where}.{k}") for k, x in v.items()}

    return by_id


def _scalar_checker(base: Any, meta: tuple[Any, ...], null: str) -> Check:
    if base is int:
        r = marker(meta, Range) or Range()
        lo, hi, want = r.lo, r.hi, f"an integer in [{r.lo}, {r.hi}]{null}"

        def an_int(v: Any, where: str) -> int:
            if type(v) is not int or not lo <= v <= hi:
                raise _bad(where, want, v)
            return v

        return an_int
    if base is float:
        return lambda v, where: _number(v, where, null)
    text = marker(meta, Text)
    if base is str and text is not None:
        pattern, want = re.compile(text.pattern), f"a plain name of at most {text.most} characters"

        def a_name(v: Any, where: str) -> str:
            if not isinstance(v, str) or not pattern.fullmatch(v):
                raise _bad(where, want, v)
            return v

        return a_name
    if base is str:
        return lambda v, where: _text(v, where, MAX_TEXT)
    raise TypeError(f"records.py declares a field as {base!r}, which schema.py cannot check")


def _number(v: Any, where: str, null: str = "") -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise _bad(where, f"a finite number{null}", v)
    if abs(v) > MAX_NUMBER:
        raise _bad(where, "a number of a sane size", v)
    return v


def _text(v: Any, where: str, most: int) -> str:
    if not isinstance(v, str) or len(v) > most:
        raise _bad(where, f"a string of at most {most} characters", v)
    return v


def _dict_checker(td: type) -> Check:
    parts = []
    for name, (tp, required) in fields(td).items():
        default = marker(split_annotated(tp)[1], Default)
        parts.append((name, checker(tp), required, default))

    def a_dict(v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise _bad(where, "an object", v)
        out = {}
        for name, check_one, required, default in parts:
            if name in v:
                out[name] = check_one(v[name], f"{where}.{name}" if where else name)
            elif default is not None:
                out[name] = default.value
            elif required:
                raise Invalid(f"{where + ' ' if where else ''}lacks {name}")
        return out

    return a_dict


def _flat_value(value: Any, where: str) -> Any:
    """An event's value: a short string, a number, a boolean or null."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, where, 64)
    return _number(value, where)


def _event(value: Any, where: str) -> dict:
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise _bad(where, "an object with a kind", value)
    out: dict[str, Any] = {}
    for k, x in value.items():
        if not isinstance(k, str) or not NAME.fullmatch(k):
            raise _bad(f"{where}'s key", "a plain name", k)
        if isinstance(x, dict):
            if len(x) > 200 or not all(isinstance(j, str) and NAME.fullmatch(j) for j in x):
                raise _bad(f"{where}.{k}", "an object of at most 200 plain names", x)
            out[k] = {j: _flat_value(y, f"{where}.{k}.{j}") for j, y in x.items()}
        else:
            out[k] = _flat_value(x, f"{where}.{k}")
    return out


def check_record(value: Any, td: type, noun: str) -> dict:
    """A whole record (``noun``: "a step record"): ``check``'s answer, its messages naming it."""
    try:
        return check(value, td, "")
    except Invalid as exc:
        if exc.message.startswith("lacks "):
            raise Invalid(f"{noun} {exc.message}") from None
        if " lacks " in exc.message:
            raise Invalid(f"{noun}'s {exc.message}") from None
        raise
