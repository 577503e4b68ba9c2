"""The ONNX Runtime backend: the only module that imports onnxruntime."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from edgeinfer.backends import LoadContext
from edgeinfer.backends.coverage import Coverage, coverage
from edgeinfer.errors import ModelLoadError, RuntimeRejected
from edgeinfer.model_config import ModelConfig, OnnxRuntimeConfig
from edgeinfer.protocol.datatypes import ONNX_TO_V2
from edgeinfer.protocol.types import TensorSpec
from edgeinfer.runners import Runner, RunnerSettings
from edgeinfer.runners.arrays import concatenating
from edgeinfer.runners.thread import ThreadRunner

log = logging.getLogger(__name__)

_OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def load(path: str, config: ModelConfig, name: str, context: LoadContext) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(path, config.backend_config, name, config.min_ep_coverage)


def choose_providers(wanted: Sequence[str], available: Sequence[str]) -> list[str]:
    """The wanted providers this build has, in the wanted order; CPU when none is left."""
    chosen = [provider for provider in wanted if provider in available]
    return chosen or ["CPUExecutionProvider"]


class OnnxRuntimeBackend:
    """One ``onnxruntime.InferenceSession``.

    Outputs that are not tensors (scikit-learn's ZipMap produces a sequence of maps) are left out of the
    metadata and never computed; inputs that are not tensors make the model unloadable.

    Batches run in worker threads (``session.run`` releases the GIL), or inline on the event loop when
    the runner predicts that is cheaper than the thread hop (CPU sessions never block on I/O).
    """

    platform = "onnx_onnxv1"
    config_platform = "onnxruntime_onnx"
    config_backend = "onnxruntime"
    warmup_applies = True

    def __init__(
        self, path: str, config: OnnxRuntimeConfig, name: str = "", min_ep_coverage: float | None = None
    ) -> None:
        self.name = name or path
        available = ort.get_available_providers()
        providers = choose_providers(config.execution_providers, available)
        wanted = config.execution_providers[0] if config.execution_providers else providers[0]
        if min_ep_coverage and wanted not in available:
            raise ModelLoadError(
                f"{path}: execution provider {wanted} is not in this ONNX Runtime build (it has "
                f"{', '.join(available)}), so no node would run on it; min_ep_coverage is {min_ep_coverage}"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = config.intra_op_num_threads
        options.inter_op_num_threads = config.inter_op_num_threads
        options.graph_optimization_level = _OPTIMIZATION_LEVELS[config.graph_optimization_level]
        options.log_severity_level = 3  # errors only; ONNX Runtime's warnings are noise for users
        profile_dir = tempfile.mkdtemp(prefix="edgeinfer-profile-")
        options.enable_profiling = True  # for one probe run below: which provider runs which node
        options.profile_file_prefix = os.path.join(profile_dir, "profile")
        try:
            chain = [(name, config.provider_options[name]) if name in config.provider_options else name
                     for name in providers]  # fmt: skip
            try:
                self._session = ort.InferenceSession(path, options, providers=chain)
            except Exception as exc:  # ONNX Runtime raises its own exception types for every failure
                raise ModelLoadError(f"ONNX Runtime cannot load {path}: {exc}") from None
            self.coverage, self.coverage_error = _probe(self._session, wanted)
        finally:
            shutil.rmtree(profile_dir, ignore_errors=True)
        self.ep_coverage = self.coverage.ratios() if self.coverage is not None else {}
        if min_ep_coverage:
            _check_coverage(path, self.coverage, self.coverage_error, min_ep_coverage)
        self.size_bytes = os.path.getsize(path) if os.path.isfile(path) else 0
        self.execution_provider = self._session.get_providers()[0]
        self.inputs = tuple(self._tensor_spec(arg, "input", path) for arg in self._session.get_inputs())
        outputs = []
        for arg in self._session.get_outputs():
            if arg.type in ONNX_TO_V2:
                outputs.append(self._tensor_spec(arg, "output", path))
            else:
                log.warning(
                    "%s: output %r of type %s is not a tensor; it is not served", path, arg.name, arg.type
                )
        if not outputs:
            raise ModelLoadError(f"{path}: the model has no tensor outputs to serve")
        self.outputs = tuple(outputs)
        self._string_inputs = {spec.name for spec in self.inputs if spec.datatype == "BYTES"}
        self._string_outputs = any(spec.datatype == "BYTES" for spec in self.outputs)
        self._run = _session_run(self._session)
        # one for every run: given None, ONNX Runtime builds a default per call, a good part of a small
        # model's run (docs/design/onnxruntime-call.md); nothing changes it during a run
        self._run_options = ort.RunOptions()
        self._all_outputs = [spec.name for spec in self.outputs]

    def runner(self, settings: RunnerSettings) -> Runner:
        return ThreadRunner(concatenating(self.name, self.infer, settings.batching), settings)

    @staticmethod
    def _tensor_spec(arg: ort.NodeArg, kind: str, path: str) -> TensorSpec:
        datatype = ONNX_TO_V2.get(arg.type)
        if datatype is None:
            raise ModelLoadError(f"{path}: {kind} {arg.name!r} has type {arg.type}, which is not a tensor")
        shape = tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in (arg.shape or []))
        return TensorSpec(arg.name, datatype, shape)

    def infer(
        self, inputs: dict[str, np.ndarray], output_names: Collection[str] | None
    ) -> dict[str, np.ndarray]:
        names = list(output_names) if output_names is not None else self._all_outputs
        feed = inputs
        if self._string_inputs:
            feed = dict(inputs)
            for name in self._string_inputs:
                feed[name] = _bytes_to_str(inputs[name])
        try:
            results = self._run(names, feed, self._run_options)
        except Exception as exc:  # ONNX Runtime's failures are all runtime failures of this model
            raise RuntimeRejected(f"ONNX Runtime failed: {exc}") from None
        if not self._string_outputs:
            return dict(zip(names, results, strict=True))
        return {name: _str_to_bytes(array) for name, array in zip(names, results, strict=True)}

    def inspect(self) -> dict[str, Any]:
        meta = self._session.get_modelmeta()
        measured = self.coverage.as_dict() if self.coverage is not None else {"error": self.coverage_error}
        return {
            "size_bytes": self.size_bytes,
            "producer": meta.producer_name,
            "graph": meta.graph_name,
            "providers": self._session.get_providers(),
            "ep_coverage": measured,
        }

    def close(self) -> None:
        del self._session


def inspect_file(path: str, providers: Sequence[str] | None = None) -> dict[str, Any]:
    """``edgeinfer inspect``: a model file's inputs and outputs (symbolic dimensions by name), size,
    opsets and parameters (when the ``onnx`` package is there), and its execution-provider coverage on
    each provider (default: every one this ONNX Runtime build has, the CPU's fallback behind it)."""
    available = ort.get_available_providers()
    wanted = list(providers or [p for p in available if p not in _REMOTE_PROVIDERS])
    report: dict[str, Any] = {"path": path, "size_bytes": os.path.getsize(path), "by_provider": {}}
    for provider in wanted:
        if provider not in available:
            missing = f"not in this ONNX Runtime build (it has {', '.join(available)})"
            report["by_provider"][provider] = {"error": missing}
            continue
        chain = tuple(dict.fromkeys([provider, "CPUExecutionProvider"]))
        try:
            backend = OnnxRuntimeBackend(path, OnnxRuntimeConfig(execution_providers=chain))
        except ModelLoadError as error:
            report["by_provider"][provider] = {"error": str(error)}
            continue
        details = backend.inspect()
        measured = {"session_providers": details["providers"], **details["ep_coverage"]}
        report["by_provider"][provider] = measured
        if "inputs" not in report:
            session = backend._session
            report["inputs"] = [_described(arg) for arg in session.get_inputs()]
            report["outputs"] = [_described(arg) for arg in session.get_outputs()]
            report["producer"], report["graph"] = details["producer"], details["graph"]
        backend.close()
    report.update(_graph_facts(path))
    return report


_REMOTE_PROVIDERS = ("AzureExecutionProvider",)  # calls a remote endpoint: nothing to measure here


def _described(arg: Any) -> dict[str, Any]:
    return {"name": arg.name, "type": arg.type, "shape": list(arg.shape or [])}


def _graph_facts(path: str) -> dict[str, Any]:
    """Opsets, operator histogram and parameter count of the file as written, read with ``onnx`` (a
    tool dependency, not the server's: without it these are left out)."""
    try:
        import onnx
    except ImportError:
        return {"graph_facts": "opsets, operators and parameters need onnx: pip install 'edgeinfer[tools]'"}
    model = onnx.load(path, load_external_data=False)
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    parameters = sum(int(np.prod(init.dims)) for init in model.graph.initializer)
    return {
        "ir_version": model.ir_version,
        "opsets": {entry.domain or "ai.onnx": entry.version for entry in model.opset_import},
        "file_ops": dict(sorted(ops.items(), key=lambda item: -item[1])),
        "parameters": parameters,
    }


PROBE_SIZE = 64


def _probe(session: ort.InferenceSession, wanted: str) -> tuple[Coverage | None, str]:
    """Run the session once on zeros (dynamic dimensions: 1 for the batch, 64 for others) while it
    profiles, then stop profiling for good: the profile says which provider ran each node. (None,
    why) when the probe cannot run, as for a model whose zeros are not a valid input.

    A provider that compiles a subgraph (OpenVINO, TensorRT) runs it as one node: its node share
    then undercounts what it runs, and the time share tells more."""
    feed = {}
    for arg in session.get_inputs():
        # a dynamic first (batch) dimension is 1; any other 64, room for a convolutional network's
        # pooling or a sequence
        shape = [
            dim if isinstance(dim, int) and dim > 0 else (1 if index == 0 else PROBE_SIZE)
            for index, dim in enumerate(arg.shape or [])
        ]
        dtype = _PROBE_DTYPES.get(arg.type)
        if dtype is None:
            session.end_profiling()
            return None, f"input {arg.name!r} has type {arg.type}"
        feed[arg.name] = np.full(shape, "", dtype=object) if dtype is str else np.zeros(shape, dtype)
    error = ""
    try:
        session.run(None, feed)
    except Exception as exc:  # the model rejects zeros: coverage stays unknown, serving is unaffected
        error = f"the probe run on zeros failed: {exc}"
    profile = session.end_profiling()
    if error:
        return None, error
    try:
        with open(profile, encoding="utf-8") as file:
            events = json.load(file)
    except (OSError, ValueError) as exc:
        return None, f"ONNX Runtime's profile is unreadable: {exc}"
    return coverage(events, wanted), ""


def _check_coverage(path: str, measured: Coverage | None, error: str, minimum: float) -> None:
    if measured is None:
        raise ModelLoadError(f"{path}: min_ep_coverage is {minimum} but coverage cannot be measured: {error}")
    if measured.ratio < minimum:
        on_wanted = round(measured.ratio * measured.nodes)
        raise ModelLoadError(
            f"{path}: {measured.ratio:.0%} of the nodes ({on_wanted} of {measured.nodes}) run on "
            f"{measured.wanted}, less than min_ep_coverage {minimum:g}; these fall back: "
            f"{measured.fallback_text()}"
        )


# ONNX tensor types the probe can make zeros of (strings: empty strings)
_PROBE_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_, "tensor(string)": str,
}  # fmt: skip


def _session_run(session: ort.InferenceSession) -> Any:
    """The session's run function. For a CPU-only session, the compiled one under ``InferenceSession.run``:
    the public wrapper re-checks input names and ownership on every call (we checked the request
    already; inputs are numpy arrays) and adds only a fallback for accelerator providers, which a
    CPU session has none of: on a small model that is a good part of the call
    (docs/design/onnxruntime-call.md). Any other session, or an ONNX Runtime without that attribute,
    goes through the public ``run``."""
    private = getattr(session, "_sess", None)
    if session.get_providers() == ["CPUExecutionProvider"] and callable(getattr(private, "run", None)):
        return private.run  # type: ignore[union-attr]
    return session.run


def _bytes_to_str(array: np.ndarray) -> np.ndarray:
    """ONNX Runtime wants ``str`` elements in string tensors."""
    out = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for index, element in enumerate(flat_in):
        flat_out[index] = (
            element.decode("utf-8", "surrogateescape") if isinstance(element, bytes) else element
        )
    return out


def _str_to_bytes(array: np.ndarray) -> np.ndarray:
    if array.dtype != object and array.dtype.kind not in ("U", "S"):
        return array
    out = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for index, element in enumerate(flat_in):
        flat_out[index] = element.encode("utf-8", "surrogateescape") if isinstance(element, str) else element
    return out
