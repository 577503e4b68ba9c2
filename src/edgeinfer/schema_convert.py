"""The conversions of ``schema.py``, one per annotation, with pydantic's lax-mode rules and messages:
scalars, literals, unions, tuples and mappings; ``Invalid`` carries what they found, by location."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

Convert = Callable[[Any], Any]


class Invalid(Exception):
    """Problems found below some location; each ``loc`` is relative to where it was raised."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors

    @classmethod
    def one(cls, kind: str, message: str, value: Any) -> Invalid:
        return cls([{"loc": (), "type": kind, "msg": message, "input": value}])

    def under(self, *loc: Any) -> list[dict[str, Any]]:
        return [{**error, "loc": (*loc, *error["loc"])} for error in self.errors]


def _none(value: Any) -> None:
    if value is not None:
        raise Invalid.one("none_required", "Input should be None", value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise Invalid.one("string_type", "Input should be a valid string", value)
    return value


def _int(value: Any) -> int:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        message = "Input should be a valid integer, got a number with a fractional part"
        raise Invalid.one("int_from_float", message, value)
    if isinstance(value, str):
        return _from_text(value, int, "int_parsing", "an integer")
    raise Invalid.one("int_type", "Input should be a valid integer", value)


def _float(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _from_text(value, float, "float_parsing", "a number")
    raise Invalid.one("float_type", "Input should be a valid number", value)


def _from_text(value: str, parse: Callable[[str], Any], kind: str, what: str) -> Any:
    """A number written as text (YAML quotes, CLI overrides); ``what``: "an integer", "a number"."""
    try:
        return parse(value.strip())
    except ValueError:
        message = f"Input should be a valid {what.split()[1]}, unable to parse string as {what}"
        raise Invalid.one(kind, message, value) from None


_TRUE = {"true", "yes", "on", "1", "t", "y"}
_FALSE = {"false", "no", "off", "0", "f", "n"}


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, (int, str)):
        message = "Input should be a valid boolean, unable to interpret input"
        raise Invalid.one("bool_parsing", message, value)
    raise Invalid.one("bool_type", "Input should be a valid boolean", value)


_SIMPLE: dict[Any, Convert] = {str: _str, int: _int, float: _float, bool: _bool}


def _literal(choices: tuple[Any, ...]) -> Convert:
    shown = [repr(choice) for choice in choices]
    listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"

    def literal(value: Any) -> Any:
        for choice in choices:
            if value == choice and type(value) is type(choice):
                return choice
        raise Invalid.one("literal_error", f"Input should be {listed}", value)

    return literal


def _member_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return f"literal[{','.join(repr(choice) for choice in typing.get_args(annotation))}]"
    return getattr(annotation, "__name__", str(annotation))


def _union(members: tuple[Any, ...], converter: Callable[[Any], Convert]) -> Convert:
    """``converter``: the conversion of each member's annotation."""
    nullable = type(None) in members
    rest = [member for member in members if member is not type(None)]
    if len(rest) == 1:  # ``X | None``: X's errors, at the field itself
        inner = converter(rest[0])
        return lambda value: None if value is None else inner(value)
    converters = [(member, _member_name(member), converter(member)) for member in rest]

    def union(value: Any) -> Any:
        if value is None and nullable:
            return None
        for member, _, convert in converters:  # an exact type first (True stays a bool, 1 an int)
            if type(value) is member:
                return convert(value)
        errors: list[dict[str, Any]] = []
        for _, name, convert in converters:
            try:
                return convert(value)
            except Invalid as invalid:  # noqa: PERF203 (config is validated once, errors are all wanted)
                errors += invalid.under(name)
        raise Invalid(errors)

    return union


def _tuple(item: Convert) -> Convert:
    def convert(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise Invalid.one("tuple_type", "Input should be a valid tuple", value)
        items, errors = [], []
        for index, element in enumerate(value):
            try:
                items.append(item(element))
            except Invalid as invalid:  # noqa: PERF203 (as above)
                errors += invalid.under(index)
        if errors:
            raise Invalid(errors)
        return tuple(items)

    return convert


def _dict(key: Convert, item: Convert) -> Convert:
    def convert(value: Any) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise Invalid.one("dict_type", "Input should be a valid dictionary", value)
        result, errors = {}, []
        for name, element in value.items():
            try:
                converted_key = key(name)
            except Invalid as invalid:
                errors += invalid.under(name, "[key]")
                continue
            try:
                result[converted_key] = item(element)
            except Invalid as invalid:
                errors += invalid.under(name)
        if errors:
            raise Invalid(errors)
        return result

    return convert
