"""The samples ``edgeinfer optimize`` compares a model and its variant on: read from a folder (V2
requests as JSON, or numpy archives) or, without one, made up from the inputs' shapes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import EdgeInferError
from edgeinfer.protocol.json_codec import decode_request

Sample = dict[str, np.ndarray]


class OptimizeError(Exception):
    """Something the user asked cannot be done (bad samples, a model ONNX Runtime cannot load)."""


def load_samples(folder: Path) -> list[Sample]:
    """Every ``*.json`` (a V2 request) and ``*.npz`` file of ``folder``, in name order."""
    files = sorted(path for path in folder.iterdir() if path.suffix in (".json", ".npz"))
    if not files:
        raise OptimizeError(f"{folder} has no samples (*.json V2 requests or *.npz arrays)")

    def read(path: Path) -> Sample:
        try:
            if path.suffix == ".npz":
                with np.load(path) as archive:
                    return {name: archive[name] for name in archive.files}
            return dict(decode_request(path.read_bytes()).inputs)
        except (OSError, ValueError, EdgeInferError) as exc:
            raise OptimizeError(f"sample {path} cannot be read: {exc}") from None

    return [read(path) for path in files]


def synthetic_samples(inputs: Sequence[Any], count: int, seed: int = 0) -> list[Sample]:
    """Random normal floats (integers 0..9, booleans) of each input's shape, dynamic dimensions 1."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = {}
        for arg in inputs:
            shape = [dim if isinstance(dim, int) and dim > 0 else 1 for dim in (arg.shape or [])]
            dtype = _NUMPY_TYPES.get(arg.type)
            if dtype is None:
                raise OptimizeError(f"input {arg.name!r} has type {arg.type}: give --samples")
            kind = np.dtype(dtype).kind
            if kind == "f":
                sample[arg.name] = rng.standard_normal(shape).astype(dtype)
            elif kind == "b":
                sample[arg.name] = rng.integers(0, 2, shape).astype(dtype)
            else:
                sample[arg.name] = rng.integers(0, 10, shape).astype(dtype)
        samples.append(sample)
    return samples


_NUMPY_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}  # fmt: skip
