"""What clients may ask about the server and its models: V2 metadata, readiness, Triton's model
configuration layout, and what a loaded version is and where it runs."""

from __future__ import annotations

from typing import Any

from edgeinfer import SERVER_NAME, __version__
from edgeinfer.errors import ModelNotReady
from edgeinfer.protocol.types import TensorSpec
from edgeinfer.repository.registry import ModelState, ModelVersion, Registry, Serving
from edgeinfer.repository.router import Router

EXTENSIONS: tuple[str, ...] = ("binary_tensor_data", "statistics", "model_configuration", "model_repository")


class ModelInfo:
    """Reads this process's registry, through the router (the version a request names, else the
    highest ready one)."""

    def __init__(self, registry: Registry, router: Router) -> None:
        self._registry = registry
        self._router = router

    def server(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def metadata(self, name: str, version: str | None) -> dict[str, Any]:
        entry = self._router.pick(name, version)
        backend = self._serving(entry).backend
        metadata = {
            "name": name,
            "versions": [other.version for other in self._registry.versions(name)],
            "platform": backend.platform,
            "inputs": [spec.as_metadata() for spec in backend.inputs],
            "outputs": [spec.as_metadata() for spec in backend.outputs],
        }
        route = self._router.route(name)
        if route is not None:  # an extra field: clients that do not know it ignore it (gRPC too)
            metadata["route"] = route.describe()
        return metadata

    def inspect(self, name: str, version: str | None) -> dict[str, Any]:
        """What the loaded version is and where it runs (``GET /v2/models/{m}/inspect``): the metadata,
        the execution provider, and what only its backend knows (an ONNX model's size and coverage)."""
        entry = self._router.pick(name, version)
        backend = self._serving(entry).backend
        return {
            "name": entry.name,
            "version": entry.version,
            "platform": backend.platform,
            "execution_provider": backend.execution_provider,
            "inputs": [spec.as_metadata() for spec in backend.inputs],
            "outputs": [spec.as_metadata() for spec in backend.outputs],
            **backend.inspect(),
        }

    def config(self, name: str, version: str | None) -> dict[str, Any]:
        """Triton's model configuration layout (what tritonclient's ``get_model_config`` reads).

        As in Triton, ``dims`` leave out the batch dimension when the model batches.
        """
        entry = self._router.pick(name, version)
        serving = self._serving(entry)
        policy, backend = serving.policy, serving.backend
        batching = policy.max_batch_size > 0

        def tensors(specs: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [
                {
                    "name": spec.name,
                    "data_type": "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}",
                    "dims": list(spec.shape[1:] if batching else spec.shape),
                }
                for spec in specs
            ]

        config: dict[str, Any] = {
            "name": name,
            "platform": backend.config_platform,
            "backend": backend.config_backend,
            "max_batch_size": policy.max_batch_size,
            "input": tensors(backend.inputs),
            "output": tensors(backend.outputs),
        }
        if batching:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(policy.preferred_batch_sizes),
                "max_queue_delay_microseconds": int(policy.max_queue_delay_s * 1_000_000),
                "default_priority_level": entry.config.default_priority_level,
            }
        if entry.config.kind == "process":
            config["instance_group"] = [{"count": entry.config.instances, "kind": "KIND_CPU"}]
        return config

    def ready(self, name: str, version: str | None) -> bool:
        try:
            entry = self._router.pick(name, version)
        except ModelNotReady:
            return False
        return entry.state is ModelState.READY

    @staticmethod
    def _serving(entry: ModelVersion) -> Serving:
        if entry.serving is None:
            raise ModelNotReady(f"model {entry.name!r} version {entry.version} is {entry.state.wire.lower()}")
        return entry.serving
