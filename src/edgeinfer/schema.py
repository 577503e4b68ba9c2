"""Frozen settings classes validated from plain data (YAML), with pydantic's rules and messages.

Why not pydantic itself: it built validators and serializers for our twenty config classes at import,
which cost ~13 MiB of RSS and ~0.2 s of start-up on a 2-core box (``python -X importtime``,
``bench/footprint.py``) — a third of what the server held beyond ONNX Runtime, for a file read once.
The config needs a small part of pydantic, and this module is that part, with its behaviour kept so
that messages read as before:

* fields are class annotations, with a default or ``Field(...)`` (``ge``/``gt``/``le``, ``min_length``,
  ``pattern``, ``alias``, ``default_factory``, ``description``); a field without a default is required;
* types: ``str``, ``int``, ``float``, ``bool``, ``Any``, ``None``, ``Literal``, unions, ``tuple[X, ...]``,
  ``dict[str, X]`` and other settings classes; coercion is pydantic's lax mode (``"5"`` and ``5.0`` are
  the int 5; ``"yes"`` is True; a string is never made from a number);
* unknown keys are errors; every problem is collected with its location (``ValidationError.errors()``
  gives pydantic's ``loc``/``type``/``msg``/``input``), not just the first;
* ``model_validator`` (``before``: on the raw mapping; ``after``: on the built object) and
  ``field_validator`` (``before``/``after`` the type check); a ``ValueError`` they raise becomes a
  ``value_error`` at their location;
* objects are immutable; ``model_copy(update=...)`` and ``model_dump()`` as in pydantic.

Types are resolved on the first validation of a class, not at import.
"""

from __future__ import annotations

import inspect
import operator
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union

from edgeinfer.schema_convert import (
    _SIMPLE,
    Convert,
    Invalid,
    _dict,
    _literal,
    _none,
    _tuple,
    _union,
)

_MISSING: Any = object()
SettingsT = TypeVar("SettingsT", bound="Settings")


class FieldInfo:
    __slots__ = (
        "alias",
        "default",
        "default_factory",
        "description",
        "ge",
        "gt",
        "le",
        "min_length",
        "pattern",
    )

    def __init__(
        self,
        default: Any,
        default_factory: Callable[[], Any] | None,
        alias: str | None,
        description: str,
        ge: float | None,
        gt: float | None,
        le: float | None,
        min_length: int | None,
        pattern: str | None,
    ) -> None:
        self.default, self.default_factory, self.alias, self.description = (
            default,
            default_factory,
            alias,
            description,
        )
        self.ge, self.gt, self.le, self.min_length, self.pattern = ge, gt, le, min_length, pattern

    @property
    def required(self) -> bool:
        return self.default is _MISSING and self.default_factory is None


def Field(
    default: Any = _MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    alias: str | None = None,
    description: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    pattern: str | None = None,
) -> Any:
    return FieldInfo(default, default_factory, alias, description, ge, gt, le, min_length, pattern)


class ValidationError(ValueError):
    """Every problem found in one validation, each as pydantic reports it."""

    def __init__(self, title: str, errors: list[dict[str, Any]]) -> None:
        self.title = title
        self._errors = errors
        lines = [f"{len(errors)} validation error(s) for {title}"]
        lines += [
            f"  {'.'.join(map(str, error['loc'])) or '(top level)'}: {error['msg']}" for error in errors
        ]
        super().__init__("\n".join(lines))

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


def field_validator(*names: str, mode: Literal["before", "after"] = "after") -> Callable[[Any], Any]:
    """Marks a classmethod ``(cls, value) -> value`` run on the named fields."""

    def mark(method: Any) -> Any:
        getattr(method, "__func__", method)._settings_validator = ("field", mode, names)
        return method

    return mark


def model_validator(*, mode: Literal["before", "after"]) -> Callable[[Any], Any]:
    """Marks a classmethod ``(cls, data) -> data`` (``before``) or a method ``(self) -> self`` (``after``)."""

    def mark(method: Any) -> Any:
        getattr(method, "__func__", method)._settings_validator = ("model", mode, ())
        return method

    return mark


class _Plan:
    """How one class validates: its fields' converters and its validators, built on first use."""

    def __init__(self, cls: type[Settings]) -> None:
        hints = typing.get_type_hints(cls)
        self.fields: dict[str, tuple[str, FieldInfo, Convert]] = {}
        for name, info in cls._fields.items():
            self.fields[name] = (info.alias or name, info, _with_constraints(_converter(hints[name]), info))
        self.keys = {key for key, _, _ in self.fields.values()}
        self.before: list[Callable[[Any], Any]] = []
        self.after: list[Callable[[Any], Any]] = []
        self.field_before: dict[str, list[Callable[[Any], Any]]] = {}
        self.field_after: dict[str, list[Callable[[Any], Any]]] = {}
        for klass in reversed(cls.__mro__):
            for attribute, member in vars(klass).items():
                marked = getattr(getattr(member, "__func__", member), "_settings_validator", None)
                if marked is None:
                    continue
                kind, mode, names = marked
                bound = getattr(cls, attribute)
                if kind == "model":
                    (self.before if mode == "before" else self.after).append(bound)
                else:
                    table = self.field_before if mode == "before" else self.field_after
                    for name in names:
                        table.setdefault(name, []).append(bound)


class Settings:
    """Base of the config classes: fields from annotations, validated by ``model_validate``."""

    _fields: typing.ClassVar[dict[str, FieldInfo]] = {}
    _plan: typing.ClassVar[_Plan | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = dict(cls._fields)
        for name, annotation in inspect.get_annotations(cls).items():
            if "ClassVar" in str(annotation):
                continue
            given = cls.__dict__.get(name, _MISSING)
            info = given if isinstance(given, FieldInfo) else Field(given)
            fields[name] = info
            if name in cls.__dict__:
                delattr(cls, name)  # the instance's value, never the class's, is what is read
        cls._fields = fields
        cls._plan = None

    def __init__(self, **data: Any) -> None:
        built = type(self).model_validate(data)
        object.__setattr__(self, "__dict__", built.__dict__)

    # ---- validation ----

    @classmethod
    def model_validate(cls: type[SettingsT], data: Any) -> SettingsT:
        try:
            return cls._validate(data)
        except Invalid as invalid:
            raise ValidationError(cls.__name__, invalid.errors) from None

    @classmethod
    def _validate(cls: type[SettingsT], data: Any) -> SettingsT:
        if isinstance(data, cls):
            return data
        plan = cls._plan
        if plan is None:
            plan = cls._plan = _Plan(cls)
        for before in plan.before:
            data = _run_validator(before, data)
        if not isinstance(data, dict):
            raise Invalid.one(
                "model_type", f"Input should be a valid dictionary or instance of {cls.__name__}", data
            )
        errors: list[dict[str, Any]] = []
        values: dict[str, Any] = {}
        given: set[str] = set()
        for name, (key, info, convert) in plan.fields.items():
            if key not in data:
                if info.required:
                    errors.append({"loc": (key,), "type": "missing", "msg": "Field required", "input": data})
                else:
                    values[name] = info.default_factory() if info.default_factory else info.default
                continue
            given.add(name)
            try:
                value = data[key]
                for before in plan.field_before.get(name, ()):
                    value = _run_validator(before, value)
                value = convert(value)
                for after in plan.field_after.get(name, ()):
                    value = _run_validator(after, value)
                values[name] = value
            except Invalid as invalid:
                errors += invalid.under(key)
        errors += [
            {
                "loc": (key,),
                "type": "extra_forbidden",
                "msg": "Extra inputs are not permitted",
                "input": value,
            }
            for key, value in data.items()
            if key not in plan.keys
        ]
        if errors:
            raise Invalid(errors)
        built = cls._build(values, given)
        for after in plan.after:
            built = _run_validator(after, built)
        return built

    @classmethod
    def _build(cls: type[SettingsT], values: dict[str, Any], given: set[str]) -> SettingsT:
        built = object.__new__(cls)
        object.__setattr__(built, "__dict__", {**values, "__fields_set__": frozenset(given)})
        return built

    # ---- the object ----

    def model_copy(self: SettingsT, update: dict[str, Any] | None = None) -> SettingsT:
        """A copy with ``update``'s fields replaced, unvalidated (as pydantic's)."""
        values = {name: getattr(self, name) for name in self._fields}
        values.update(update or {})
        return type(self)._build(values, set(self.__dict__["__fields_set__"]) | set(update or ()))

    def model_dump(self, *, exclude_none: bool = False, exclude_unset: bool = False) -> dict[str, Any]:
        fields_set = self.__dict__["__fields_set__"]
        dumped = {}
        for name in self._fields:
            value = getattr(self, name)
            if (exclude_none and value is None) or (exclude_unset and name not in fields_set):
                continue
            dumped[name] = _dump(value, exclude_none, exclude_unset)
        return dumped

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self._fields)

    def __hash__(self) -> int:
        return hash((type(self), *(getattr(self, name) for name in self._fields)))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({shown})"


def _dump(value: Any, exclude_none: bool, exclude_unset: bool) -> Any:
    if isinstance(value, Settings):
        return value.model_dump(exclude_none=exclude_none, exclude_unset=exclude_unset)
    if isinstance(value, tuple):
        return tuple(_dump(item, exclude_none, exclude_unset) for item in value)
    if isinstance(value, dict):
        return {key: _dump(item, exclude_none, exclude_unset) for key, item in value.items()}
    return value


def _run_validator(validator: Callable[[Any], Any], value: Any) -> Any:
    try:
        return validator(value)
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            raise Invalid(exc.errors()) from None
        raise Invalid.one("value_error", f"Value error, {exc}", value) from None


# ---- converters: one per annotation, pydantic's lax mode ----


def _converter(annotation: Any) -> Convert:
    if annotation is Any:
        return lambda value: value
    if annotation is type(None) or annotation is None:
        return _none
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return annotation._validate
    simple = _SIMPLE.get(annotation)
    if simple is not None:
        return simple
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return _literal(arguments)
    if origin is Union or origin is types.UnionType:
        return _union(arguments, _converter)
    if origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis:
        return _tuple(_converter(arguments[0]))
    if origin is dict:
        return _dict(_converter(arguments[0]), _converter(arguments[1]))
    raise TypeError(f"settings fields of type {annotation!r} are not supported")


def _with_constraints(convert: Convert, info: FieldInfo) -> Convert:
    """The field's converter followed by its bounds, length and pattern (None passes: it is optional)."""
    checks: list[Callable[[Any], None]] = []
    if info.ge is not None:
        checks.append(_bound(info.ge, operator.ge, "greater_than_equal", "greater than or equal to"))
    if info.gt is not None:
        checks.append(_bound(info.gt, operator.gt, "greater_than", "greater than"))
    if info.le is not None:
        checks.append(_bound(info.le, operator.le, "less_than_equal", "less than or equal to"))
    if info.min_length is not None:
        checks.append(_min_length(info.min_length))
    if info.pattern is not None:
        checks.append(_pattern(info.pattern))
    if not checks:
        return convert

    def constrained(value: Any) -> Any:
        value = convert(value)
        if value is not None:
            for check in checks:
                check(value)
        return value

    return constrained


def _bound(limit: float, holds: Callable[[Any, float], bool], kind: str, words: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, (int, float)) and not holds(value, limit):
            raise Invalid.one(kind, f"Input should be {words} {limit}", value)

    return check


def _min_length(least: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, str) and len(value) < least:
            unit = "character" if least == 1 else "characters"
            raise Invalid.one("string_too_short", f"String should have at least {least} {unit}", value)

    return check


def _pattern(pattern: str) -> Callable[[Any], None]:
    compiled = re.compile(pattern)

    def check(value: Any) -> None:
        if isinstance(value, str) and not compiled.search(value):
            raise Invalid.one("string_pattern_mismatch", f"String should match pattern '{pattern}'", value)

    return check
