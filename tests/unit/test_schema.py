"""The settings classes behind the config: pydantic's coercions, locations and messages (the expected
messages below are what pydantic 2 answered for the same inputs), defaults, validators, copies."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from edgeinfer.schema import Field, Settings, ValidationError, field_validator, model_validator


class Inner(Settings):
    size: int = Field(1, ge=1)


class Sample(Settings):
    i: int = 0
    f: float = 0.0
    b: bool = True
    s: str = ""
    t: tuple[int, ...] = ()
    d: dict[str, int] = Field(default_factory=dict)
    lit: Literal["x", "y", "z"] = "x"
    w: int | Literal["auto"] = 1
    u: str | int | float | bool = 1
    m: str = Field("abcd", min_length=1, pattern=r"^[0-9a-f]{4}$")
    g: float = Field(1.0, gt=0, le=1)
    o: int | None = None
    inner: Inner = Inner()
    inners: tuple[Inner, ...] = ()
    source: str | None = Field(None, alias="from")
    anything: Any = None


class Validated(Settings):
    low: float
    high: float
    version: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        return {"low": data[0], "high": data[1]} if isinstance(data, list) else data

    @field_validator("version", mode="before")
    @classmethod
    def _text(cls, version: Any) -> Any:
        return str(version) if isinstance(version, int) else version

    @field_validator("high")
    @classmethod
    def _finite(cls, high: float) -> float:
        if high > 1e6:
            raise ValueError("high is too high")
        return high

    @model_validator(mode="after")
    def _ordered(self) -> Validated:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


@pytest.mark.parametrize(
    ("data", "field", "value"),
    [
        ({"i": True}, "i", 1),
        ({"i": 5.0}, "i", 5),
        ({"i": "5"}, "i", 5),
        ({"f": True}, "f", 1.0),
        ({"f": "1.5"}, "f", 1.5),
        ({"b": "yes"}, "b", True),
        ({"b": "Off"}, "b", False),
        ({"b": 0}, "b", False),
        ({"t": [1, "2"]}, "t", (1, 2)),
        ({"w": True}, "w", 1),
        ({"w": "auto"}, "w", "auto"),
        ({"u": True}, "u", True),  # an exact type match wins: not the int 1
        ({"u": 2.5}, "u", 2.5),
        ({"o": 2.0}, "o", 2),
        ({"o": None}, "o", None),
        ({"inner": {"size": 3}}, "inner", Inner(size=3)),
        ({"inners": [{"size": 2}, {}]}, "inners", (Inner(size=2), Inner())),
        ({"from": "a.b"}, "source", "a.b"),
        ({"anything": [1, {"x": None}]}, "anything", [1, {"x": None}]),
        ({}, "d", {}),
    ],
)
def test_values_are_coerced_as_pydantic_does(data, field, value):
    assert getattr(Sample.model_validate(data), field) == value


@pytest.mark.parametrize(
    ("data", "errors"),
    [
        (
            {"i": 5.5},
            [
                (
                    ("i",),
                    "int_from_float",
                    "Input should be a valid integer, got a number with a fractional part",
                )
            ],
        ),
        (
            {"i": "four"},
            [
                (
                    ("i",),
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                )
            ],
        ),
        ({"i": None}, [(("i",), "int_type", "Input should be a valid integer")]),
        (
            {"f": "x"},
            [(("f",), "float_parsing", "Input should be a valid number, unable to parse string as a number")],
        ),
        ({"b": 2}, [(("b",), "bool_parsing", "Input should be a valid boolean, unable to interpret input")]),
        ({"s": 5}, [(("s",), "string_type", "Input should be a valid string")]),
        (
            {"t": [1, "a"]},
            [
                (
                    ("t", 1),
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                )
            ],
        ),
        ({"t": 5}, [(("t",), "tuple_type", "Input should be a valid tuple")]),
        ({"d": {1: 2}}, [(("d", 1, "[key]"), "string_type", "Input should be a valid string")]),
        ({"d": 5}, [(("d",), "dict_type", "Input should be a valid dictionary")]),
        ({"lit": "q"}, [(("lit",), "literal_error", "Input should be 'x', 'y' or 'z'")]),
        (
            {"w": "many"},
            [
                (
                    ("w", "int"),
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                ),
                (("w", "literal['auto']"), "literal_error", "Input should be 'auto'"),
            ],
        ),
        (
            {"u": [1]},
            [
                (("u", "str"), "string_type", "Input should be a valid string"),
                (("u", "int"), "int_type", "Input should be a valid integer"),
                (("u", "float"), "float_type", "Input should be a valid number"),
                (("u", "bool"), "bool_type", "Input should be a valid boolean"),
            ],
        ),
        ({"m": ""}, [(("m",), "string_too_short", "String should have at least 1 character")]),
        ({"m": "zz"}, [(("m",), "string_pattern_mismatch", "String should match pattern '^[0-9a-f]{4}$'")]),
        ({"g": 0}, [(("g",), "greater_than", "Input should be greater than 0")]),
        ({"g": 2}, [(("g",), "less_than_equal", "Input should be less than or equal to 1")]),
        (
            {"inner": {"size": 0}},
            [(("inner", "size"), "greater_than_equal", "Input should be greater than or equal to 1")],
        ),
        (
            {"inners": [{}, {"sise": 2}]},
            [(("inners", 1, "sise"), "extra_forbidden", "Extra inputs are not permitted")],
        ),
        (
            {"inner": 3},
            [(("inner",), "model_type", "Input should be a valid dictionary or instance of Inner")],
        ),
        ("text", [((), "model_type", "Input should be a valid dictionary or instance of Sample")]),
        (
            {"source": "a"},
            [(("source",), "extra_forbidden", "Extra inputs are not permitted")],
        ),  # only its alias
        (
            {"i": "x", "s": 1, "typo": 1},  # every problem, in field order, unknown keys last
            [
                (
                    ("i",),
                    "int_parsing",
                    "Input should be a valid integer, unable to parse string as an integer",
                ),
                (("s",), "string_type", "Input should be a valid string"),
                (("typo",), "extra_forbidden", "Extra inputs are not permitted"),
            ],
        ),
    ],
)
def test_errors_carry_pydantics_location_type_and_message(data, errors):
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate(data)
    assert [(error["loc"], error["type"], error["msg"]) for error in caught.value.errors()] == errors


@pytest.mark.parametrize(
    ("data", "errors"),
    [
        ({"high": 2}, [(("low",), "missing", "Field required")]),
        ({"low": 1, "high": 2e6}, [(("high",), "value_error", "Value error, high is too high")]),
        ({"low": 3, "high": 2}, [((), "value_error", "Value error, low (3) must be below high (2)")]),
        ([3, 2], [((), "value_error", "Value error, low (3) must be below high (2)")]),
    ],
)
def test_validators_report_value_errors_where_they_run(data, errors):
    with pytest.raises(ValidationError) as caught:
        Validated.model_validate(data)
    assert [(error["loc"], error["type"], error["msg"]) for error in caught.value.errors()] == errors


def test_before_validators_reshape_the_input():
    assert Validated.model_validate([1, 2]) == Validated(low=1, high=2)
    assert Validated.model_validate({"low": 1, "high": 2, "version": 3}).version == "3"


def test_objects_are_frozen_and_compare_by_value():
    sample = Sample(i=3)
    with pytest.raises(AttributeError, match="frozen"):
        sample.i = 4  # type: ignore[misc]
    assert sample == Sample(i="3")
    assert sample != Sample(i=4)
    assert hash(Inner(size=2)) == hash(Inner(size=2))
    assert repr(Inner(size=2)) == "Inner(size=2)"


def test_copy_and_dump():
    sample = Sample.model_validate({"i": 3, "inner": {"size": 2}, "inners": [{}]})
    copied = sample.model_copy(update={"s": "new"})
    assert (copied.i, copied.s, sample.s) == (3, "new", "")
    dumped = sample.model_dump()
    assert dumped["inner"] == {"size": 2}
    assert dumped["inners"] == ({"size": 1},)
    assert sample.model_dump(exclude_unset=True) == {"i": 3, "inner": {"size": 2}, "inners": ({},)}
    assert "o" not in sample.model_dump(exclude_none=True)
    assert copied.model_dump(exclude_unset=True)["s"] == "new"


def test_defaults_are_not_shared_when_made_by_a_factory():
    first, second = Sample(), Sample()
    assert first.d == {}
    assert first.d is not second.d


def test_a_required_field_without_default():
    with pytest.raises(ValidationError, match="low: Field required"):
        Validated(high=2)
