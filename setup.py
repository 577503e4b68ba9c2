"""The parts of edgeinfer built to native code. Both are optional: where no C compiler is found (for the
request path, or no Python headers) the build goes on without them and the same code runs as Python.
Everything else is in pyproject.toml.

* protocol/_jsonscan.c parses the numbers of large JSON bodies without the GIL (protocol/json_scan.py);
  without it, JSON bodies are decoded on the event loop as before (docs/design/json-scan.md).
* The request path (``COMPILED``), compiled from its own type-annotated Python by mypyc: at concurrency
  1 the server's CPU time is a request's latency, and most of it is the interpreter running our code
  between the C parts (httptools, orjson, numpy, ONNX Runtime). ``EDGEINFER_COMPILE=0`` builds without
  it (to profile or debug the Python). What the request path makes per request or per batch is a plain
  class with ``__slots__`` and its own ``__init__``, not a dataclass, whose generated ``__init__`` mypyc
  leaves interpreted; configuration and policy objects made once stay dataclasses.
  ``server/idle_poll.py`` is not compiled: its tests subclass ``IdlePoll``, and an interpreted class
  cannot subclass a compiled one. The measurements: docs/design/mypyc.md.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

# The modules every inference request runs through, from the HTTP parser's callbacks to the runner.
# Each must keep to what mypyc compiles (README, Development): tests/conftest.py refuses to run
# against a compiled module older than its source.
COMPILED = [
    "edgeinfer/admission/admission.py",
    "edgeinfer/admission/estimates.py",
    "edgeinfer/admission/lag.py",
    "edgeinfer/admission/margin.py",
    "edgeinfer/admission/standing.py",
    "edgeinfer/admission/view.py",
    "edgeinfer/afterwards.py",
    "edgeinfer/batching/batcher.py",
    "edgeinfer/batching/jobs.py",
    "edgeinfer/batching/policy.py",
    "edgeinfer/batching/recorder.py",
    "edgeinfer/batching/stats.py",
    "edgeinfer/head.py",
    "edgeinfer/metrics.py",
    "edgeinfer/outcome.py",
    "edgeinfer/protocol/datatypes.py",
    "edgeinfer/protocol/http_binary.py",
    "edgeinfer/protocol/json_codec.py",
    "edgeinfer/protocol/json_depth.py",
    "edgeinfer/protocol/json_tensors.py",
    "edgeinfer/protocol/types.py",
    "edgeinfer/repository/router.py",
    "edgeinfer/runners/arrays.py",
    "edgeinfer/runners/base.py",
    "edgeinfer/runners/cost.py",
    "edgeinfer/runners/inline.py",
    "edgeinfer/runners/thread.py",
    "edgeinfer/server/http.py",
    "edgeinfer/server/http_errors.py",
    "edgeinfer/server/http_infer.py",
    "edgeinfer/server/http_messages.py",
    "edgeinfer/server/http_protocol.py",
    "edgeinfer/server/http_routes.py",
    "edgeinfer/service.py",
    "edgeinfer/turn_refusals.py",
    "edgeinfer/validation.py",
]


def compiled() -> list[Extension]:
    if os.environ.get("EDGEINFER_COMPILE", "1") == "0":
        return []
    from mypyc.build import mypycify  # a build requirement (pyproject.toml)

    extensions = mypycify([f"src/{path}" for path in COMPILED], group_name="edgeinfer")
    for extension in extensions:
        extension.optional = True  # no C compiler: the modules stay Python
    return extensions


setup(
    ext_modules=[
        Extension(
            "edgeinfer.protocol._jsonscan",
            sources=["src/edgeinfer/protocol/_jsonscan.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        ),
        *compiled(),
    ]
)
