"""edgeinfer: a small, fast Open Inference Protocol (KServe V2) server for ONNX and Python models.

The programmatic API::

    import edgeinfer

    class Doubler(edgeinfer.Model):
        inputs = [edgeinfer.TensorSpec("x", "FP32", (-1, 4))]
        outputs = [edgeinfer.TensorSpec("y", "FP32", (-1, 4))]

        def predict(self, requests):
            return [{"y": request.inputs["x"] * 2} for request in requests]

    server = edgeinfer.Server()
    server.register(Doubler(), name="doubler", max_batch_size=32, max_batch_time=0.01)
    server.run(http_port=8080)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
SERVER_NAME = "edgeinfer"  # in server metadata and on the status page

__all__ = ["Model", "ModelError", "Request", "Server", "TensorSpec", "__version__"]

if TYPE_CHECKING:
    from edgeinfer.app import Server
    from edgeinfer.backends.python import Model, ModelError, Request
    from edgeinfer.protocol.types import TensorSpec

_LAZY = {
    "Model": "edgeinfer.backends.python",
    "ModelError": "edgeinfer.backends.python",
    "Request": "edgeinfer.backends.python",
    "TensorSpec": "edgeinfer.protocol.types",
    "Server": "edgeinfer.app",
}


def __getattr__(name: str) -> Any:
    """Import the public API on first use, so ``edgeinfer --version`` loads nothing else."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edgeinfer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
