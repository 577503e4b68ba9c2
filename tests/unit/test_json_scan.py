"""The GIL-free scan of long numeric arrays (json_scan.py, _jsonscan.c): every value it returns is the one
the ordinary decoder gives (the nearest double, then float32), and anything else it leaves alone."""

from __future__ import annotations

import shutil

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.errors import EdgeInferError
from edgeinfer.protocol import json_codec, json_scan

N = json_scan.MIN_COUNT

needs_library = pytest.mark.skipif(
    not json_scan.available(), reason="the C library was not built (no compiler)"
)


def test_the_library_is_built_where_there_is_a_c_compiler():
    """setup.py builds it as an optional extension: a broken build would otherwise go unnoticed."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the library is optional")
    assert json_scan.available()


def expected(numbers: list[str]) -> np.ndarray:
    """What the ordinary decoder makes of these numbers: Python's float (correctly rounded), then float32."""
    with np.errstate(over="ignore"):
        return np.array([float(number) for number in numbers]).astype(np.float32)


def scan_one(numbers: list[str], padding: int = 0) -> np.ndarray | None:
    body = ('{"data": [' + " " * padding + ", ".join(numbers) + "]}").encode()
    found = json_scan.float32_arrays(body)
    if found is None:
        return None
    assert len(found.values) == 1
    assert found.integers == [not any(mark in number for number in numbers for mark in ".eE")]
    assert body[found.starts[0] : found.starts[0] + 1] == b"["
    assert body[found.ends[0] - 1 : found.ends[0]] == b"]"
    return found.values[0]


def same_bits(found: np.ndarray, numbers: list[str]) -> None:
    np.testing.assert_array_equal(found.view(np.uint32), expected(numbers).view(np.uint32))


@needs_library
@pytest.mark.parametrize(
    "format_",
    [
        lambda values: [str(v) for v in values.astype(np.float32).tolist()],  # Python's repr of doubles
        lambda values: (
            orjson.dumps(values.astype(np.float32), option=orjson.OPT_SERIALIZE_NUMPY)
            .decode()[1:-1]
            .split(",")
        ),  # orjson's float32: the shortest that reads back
        lambda values: [f"{v:.6e}" for v in values],
        lambda values: [f"{v:.25f}" for v in values],  # more digits than kept: rounded the slow way
        lambda values: [f"{(abs(v) % 9 + 1) * 1e-30:.9g}" for v in values],  # two steps of 1e22
        lambda values: [str(int(v * 1000)) for v in values],
    ],
    ids=["repr", "orjson-float32", "exponent", "long-fraction", "tiny", "integers"],
)
def test_common_formats_are_taken_out_exactly(format_):
    values = np.random.default_rng(7).standard_normal(4 * N) * 10.0 ** np.random.default_rng(8).integers(
        -8, 8, 4 * N
    )
    numbers = format_(values)
    found = scan_one(numbers)
    assert found is not None, "these formats take the fast path"
    same_bits(found, numbers)


@needs_library
@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False).map(repr),
            st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
            st.integers(-(2**70), 2**70).map(str),
            st.builds(
                lambda sign, whole, fraction, exponent: f"{sign}{whole}.{fraction}e{exponent}",
                st.sampled_from(["", "-"]),
                st.integers(0, 10**12),
                st.text("0123456789", min_size=1, max_size=30),
                st.integers(-60, 60),
            ),
        ),
        min_size=N,
        max_size=N + 8,
    )
)
def test_any_number_is_exact_or_left_to_the_ordinary_decoder(numbers):
    found = scan_one(numbers)
    if found is not None:  # else: out of float32's normal range, too many digits, or near a halfway point
        same_bits(found, numbers)


@needs_library
@pytest.mark.parametrize(
    ("number", "bits"),
    [("-0", 0x00000000), ("-0.0", 0x80000000), ("-0e3", 0x80000000), ("0", 0), ("0.000", 0)],
)
def test_zeros_keep_the_sign_json_gives_them(number, bits):
    """``-0`` is the integer 0; ``-0.0`` a negative zero (as Python's own parsers have them)."""
    found = scan_one(["1"] * N + [number])
    assert found is not None
    assert int(found[-1:].view(np.uint32)[0]) == bits


@needs_library
@pytest.mark.parametrize(
    "bad",
    [
        "01", "1.", ".5", "+1", "1e", "1e+", "-", "--1", "NaN", "Infinity", "-Infinity", "0x10", "1_000",
        "true", "null", '"1"', "[1]", "{}", "1 2", "",
        "1e39", "-3.5e38", "1e-39", "1e-300", "1e400",  # beyond float32's normal range
        "12345678901234567",  # an integer beyond 15 digits: the ordinary decoder types it
    ],
)  # fmt: skip
def test_an_array_with_anything_but_numbers_it_converts_is_left_alone(bad):
    numbers = ["0.5"] * N
    numbers[N // 2] = bad
    assert scan_one(numbers) is None


@needs_library
def test_only_arrays_outside_strings_are_taken_and_short_ones_are_not():
    array = "[" + ",".join(["2.5"] * N) + "]"
    short = "[" + ",".join(["2.5"] * (N - 1)) + "]"
    spaced = array.replace(",", " ,\n ")
    body = (
        f'{{"a": "{array}", "b": "say \\"{array}\\"", "c": {short}, "d": \t{spaced}, '
        f'"e": [{array}, {array}], "f": "\\\\", "g": {array}}}'
    ).encode()
    found = json_scan.float32_arrays(body)
    assert found is not None
    taken = [orjson.loads(body[start:end]) for start, end in zip(found.starts, found.ends, strict=True)]
    assert taken == [[2.5] * N] * 4  # d, e's two (not e itself: it holds arrays), g
    assert [values.size for values in found.values] == [N] * 4
    assert json_scan.float32_arrays(b'{"x": [' + b"1," * (N - 1) + b"1") is None  # never closed


@needs_library
def test_a_body_with_more_arrays_than_it_takes_is_left_whole():
    array = "[" + ",".join(["1"] * N) + "]"
    body = ("[" + ",".join([array] * (json_scan.MAX_ARRAYS + 1)) + "]").encode()
    assert json_scan.float32_arrays(body) is None
    assert json_scan.float32_arrays(body.replace(b"[", b"", 1)[: len(array) * 2 + 1]) is not None


def decode_both(document: dict | bytes):
    """(with the scanned arrays, without): each a request or the error's message."""
    body = document if isinstance(document, bytes) else orjson.dumps(document)

    def attempt(scanned):
        try:
            return json_codec.decode_request(body, scanned=scanned)
        except EdgeInferError as error:
            return str(error)

    return attempt(json_scan.float32_arrays(body)), attempt(None)


def image(name: str = "x", datatype: str = "FP32", shape: tuple = (2, N), data: object = None) -> dict:
    values = np.random.default_rng(3).standard_normal(abs(int(np.prod(shape)))).astype(np.float32).tolist()
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(shape),
        "data": values if data is None else data,
    }


BIG = 2**24 + 1  # the first integer float32 does not hold


# (document, whether the scanned arrays decode it; else the other paths do)
CASES = {
    "one": ({"inputs": [image()], "id": "r", "parameters": {"p": 1}, "outputs": [{"name": "y"}]}, True),
    "three": (
        {"inputs": [image("a"), image("b", shape=(N,)), {**image("c", shape=(2,)), "data": [1.5, 2]}]},
        True,
    ),
    "uint8": ({"inputs": [image(datatype="UINT8", data=[7, 255, 0, -0] * (N // 2))]}, True),
    "int32": ({"inputs": [image(datatype="INT32", data=[-(BIG - 2), BIG - 2] * N)]}, True),
    "int64-big": ({"inputs": [image(datatype="INT64", data=[BIG] * 2 * N)]}, False),
    "int32-fraction": ({"inputs": [image(datatype="INT32", data=[1.0] * 2 * N)]}, False),
    "uint8-negative": ({"inputs": [image(datatype="UINT8", data=[-1] * 2 * N)]}, False),
    "int8-range": ({"inputs": [image(datatype="INT8", data=[300] * 2 * N)]}, False),
    "fp64": ({"inputs": [image(datatype="FP64")]}, False),  # scanned, but not exactly: the other paths
    "fp16": ({"inputs": [image(datatype="FP16")]}, False),
    "nested": ({"inputs": [image(data=[list(range(N)), list(range(N))])]}, False),  # arrays in the data
    "elsewhere": ({"inputs": [image()], "parameters": {"weights": list(range(N))}}, False),
    "miscounted": ({"inputs": [image(shape=(3, N), data=image()["data"])]}, False),
    "negative": ({"inputs": [image(shape=(2, -N))]}, False),
    "twice": ({"inputs": [image(), image()]}, False),
    # a stand-in guessed (without the process's secret): a string, as the other paths see it
    "guessed": ({"inputs": [image(data="edgeinfer-scanned-0"), image("y")]}, True),
    "bad-id": ({"inputs": [image()], "id": 5}, True),  # the rest of the body is checked as always
    "extra-field": ({"inputs": [image()], "extra": True}, True),
}


@needs_library
@pytest.mark.parametrize(("document", "taken"), CASES.values(), ids=CASES.keys())
def test_the_scanned_arrays_decode_what_they_hold_exactly(document, taken):
    body = orjson.dumps(document)
    scanned = json_scan.float32_arrays(body)
    assert scanned is not None
    try:
        decoded = json_codec._decode_scanned(body, scanned, json_codec.MAX_DEPTH)
    except EdgeInferError:
        decoded = "an error"  # a request the rest of whose body is wrong
    assert (decoded is not None) is taken


# What the ordinary decoder answers each case with: a request (None), or its message. Without this, both
# paths giving the same wrong error would pass the comparison below.
REFUSED = {
    "int32-fraction": "input 'x': data does not fit datatype INT32: the data holds fractional numbers",
    "uint8-negative": "input 'x': data does not fit datatype UINT8: -1 is outside [0, 255]",
    "int8-range": "input 'x': data does not fit datatype INT8: 300 is outside [-128, 127]",
    "miscounted": f"input 'x': shape [3, {N}] needs {3 * N} elements but 'data' has {2 * N}",
    "negative": f"input 'x': 'shape' must be a list of non-negative integers, got [2, -{N}]",
    "twice": "input 'x' appears more than once",
    "guessed": f"input 'x': shape [2, {N}] needs {2 * N} elements but 'data' has 1",
    "bad-id": "'id' must be a string, not a number",
}


@needs_library
@pytest.mark.parametrize(
    ("document", "refused"),
    [(document, REFUSED.get(case)) for case, (document, _) in CASES.items()],
    ids=CASES.keys(),
)
def test_a_request_decodes_the_same_with_its_arrays_scanned(document, refused):
    scanned, ordinary = decode_both(document)
    assert (ordinary if isinstance(ordinary, str) else None) == refused
    if isinstance(ordinary, str):
        assert scanned == ordinary
        return
    assert not isinstance(scanned, str), scanned
    assert (scanned.id, scanned.parameters, scanned.outputs) == (
        ordinary.id,
        ordinary.parameters,
        ordinary.outputs,
    )
    assert scanned.inputs.keys() == ordinary.inputs.keys()
    for name, array in ordinary.inputs.items():
        assert scanned.inputs[name].dtype == array.dtype
        assert scanned.inputs[name].shape == array.shape
        np.testing.assert_array_equal(scanned.inputs[name], array)


@needs_library
def test_a_body_that_is_not_json_gets_the_ordinary_message():
    array = "[" + ",".join(["1"] * N) + "]"
    scanned, ordinary = decode_both(f'{{"inputs": [{{"data": {array}}}]'.encode())
    assert scanned == ordinary
    assert scanned.startswith("request body is not valid JSON")
