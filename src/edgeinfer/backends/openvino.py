"""The OpenVINO backend (``backend: openvino``): an ONNX (or OpenVINO IR) model compiled by OpenVINO.

Intel's runtime compiles the whole graph for one device (``CPU`` here; ``GPU`` and ``NPU`` where the
box has them and their drivers), instead of ONNX Runtime's node-by-node assignment to providers. It
is an optional extra (``pip install 'edgeinfer[openvino]'``), imported only when a model asks for it.

``backend_config`` keys it reads: ``device`` (default ``CPU``), ``intra_op_num_threads`` (OpenVINO's
``INFERENCE_NUM_THREADS``; 0 lets it choose), ``performance_hint`` (``LATENCY`` by default: the
batcher already forms batches), ``cache_dir`` (compiled blobs are kept there and reused at the next
load: a GPU or NPU compile takes seconds) and ``precision`` (``INFERENCE_PRECISION_HINT``, e.g. ``f16``
on a GPU). On the CPU the precision is ``f32`` unless set: OpenVINO's own default there is ``bf16`` on
CPUs that have it (AVX512-BF16, AMX), and a model's answers then differ from its FP32 ones by about
1 % (measured on an AMD EPYC VM against ONNX Runtime: up to 1.6 % on a 16-output MLP); ``precision:
bf16`` asks for it. Batches run in worker threads, one OpenVINO infer request per concurrent batch (a request
is not thread-safe; the compiled model is).
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import openvino as ov

from edgeinfer.backends import LoadContext
from edgeinfer.errors import ModelLoadError, RuntimeRejected
from edgeinfer.model_config import ModelConfig, OnnxRuntimeConfig
from edgeinfer.protocol.types import TensorSpec
from edgeinfer.runners import Runner, RunnerSettings
from edgeinfer.runners.arrays import concatenating
from edgeinfer.runners.thread import ThreadRunner

log = logging.getLogger(__name__)

# OpenVINO element type names -> V2 datatypes
_V2_TYPES = {
    "f32": "FP32", "f16": "FP16", "f64": "FP64", "bf16": "BF16",
    "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "boolean": "BOOL",
}  # fmt: skip


def load(path: str, config: ModelConfig, name: str, context: LoadContext) -> OpenVinoBackend:
    return OpenVinoBackend(path, config.backend_config, name, config.max_concurrent_batches)


class OpenVinoBackend:
    platform = "openvino"
    config_platform = ""
    config_backend = "openvino"
    warmup_applies = True
    ep_coverage: Mapping[str, float] = MappingProxyType({})  # one device compiles the whole graph

    def __init__(self, path: str, config: OnnxRuntimeConfig, name: str = "", requests: int = 1) -> None:
        self.name = name or path
        self.device = config.device
        core = ov.Core()
        devices = core.available_devices  # CPU, GPU.0, GPU.1, NPU: a device is named with or without index
        if self.device.split(":")[0].split(".")[0] not in {device.split(".")[0] for device in devices}:
            listed = ", ".join(devices)
            raise ModelLoadError(f"{path}: OpenVINO has no device {self.device!r} here (it has {listed})")
        properties: dict[str, Any] = {"PERFORMANCE_HINT": config.performance_hint}
        if config.intra_op_num_threads:
            properties["INFERENCE_NUM_THREADS"] = config.intra_op_num_threads
        precision = config.precision or ("f32" if self.device.upper().startswith("CPU") else None)
        if precision:  # (OpenVINO's CPU default is bf16 where the CPU has it: answers off by ~1 %)
            properties["INFERENCE_PRECISION_HINT"] = precision
        if config.cache_dir:
            os.makedirs(config.cache_dir, exist_ok=True)
            properties["CACHE_DIR"] = config.cache_dir
        try:
            model = core.read_model(path)
            self._compiled = core.compile_model(model, self.device, properties)
        except Exception as exc:  # OpenVINO raises RuntimeError for every kind of failure
            raise ModelLoadError(f"OpenVINO cannot load {path} on {self.device}: {exc}") from None
        self.execution_provider = f"OpenVINO {self.device}"
        self.inputs = tuple(_spec(port, "input", path) for port in self._compiled.inputs)
        self.outputs = tuple(_spec(port, "output", path) for port in self._compiled.outputs)
        ports = zip(self.outputs, self._compiled.outputs, strict=True)
        self._ports = {spec.name: port for spec, port in ports}
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(max(1, requests)):
            self._requests.put(self._compiled.create_infer_request())
        self._path = path

    def runner(self, settings: RunnerSettings) -> Runner:
        return ThreadRunner(concatenating(self.name, self.infer, settings.batching), settings)

    def infer(
        self, inputs: dict[str, np.ndarray], output_names: Collection[str] | None
    ) -> dict[str, np.ndarray]:
        request = self._requests.get()
        try:
            results = request.infer(inputs)  # copies the outputs out of the request (share_outputs=False)
        except Exception as exc:
            raise RuntimeRejected(f"OpenVINO failed: {exc}") from None
        finally:
            self._requests.put(request)
        names = output_names if output_names is not None else self._ports.keys()
        return {name: np.asarray(results[self._ports[name]]) for name in names}

    def inspect(self) -> dict[str, Any]:
        return {
            "size_bytes": os.path.getsize(self._path) if os.path.isfile(self._path) else 0,
            "device": self.device,
            "openvino": ov.__version__,
            "properties": {
                key: str(self._compiled.get_property(key))
                for key in ("PERFORMANCE_HINT", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT")
            },
        }

    def close(self) -> None:
        del self._requests
        del self._compiled


def _spec(port: Any, kind: str, path: str) -> TensorSpec:
    type_name = port.get_element_type().get_type_name()
    datatype = _V2_TYPES.get(type_name)
    if datatype is None:
        raise ModelLoadError(f"{path}: {kind} {port.get_any_name()!r} has type {type_name}, not served")
    shape = tuple(dim.get_length() if dim.is_static else -1 for dim in port.get_partial_shape())
    return TensorSpec(port.get_any_name(), datatype, shape)
