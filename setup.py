"""The parts of edgeinfer built to native code. Both are optional: where no C compiler is found (for the
request path, or no Python headers) the build goes on without them and the same code runs as Python.
Everything else is in pyproject.toml.

* protocol/_jsonscan.c parses the numbers of large JSON bodies without the GIL (protocol/json_scan.py);
  without it, JSON bodies are decoded on the event loop as before.
* The request path (``COMPILED``), compiled from its own type-annotated Python by mypyc. At concurrency
  1 the server's CPU time is a request's latency, and most of it is the interpreter running our code
  between the C parts (httptools, orjson, numpy, ONNX Runtime): compiled, `tiny`'s request took about a
  third less of it (README, Development). ``EDGEINFER_COMPILE=0`` builds without it (to profile or debug
  the Python).

  What the request path makes per request or per batch (``Outcome``, ``HttpRequest``, ``HttpResponse``,
  ``Work``, ``Pending``, ``BatchTimes``, ...) is a plain class with ``__slots__`` and its own
  ``__init__``, not a dataclass: mypyc keeps the ``__init__`` a dataclass generates, which runs
  interpreted (py-spy, `tiny` over HTTP on a slow VM: 6 % of the event loop's samples). Written out,
  compiled, the same in-process requests (client and server together, ``valgrind --tool=callgrind``,
  300 requests, five runs each) took 142.7-144.5 million instructions instead of 155.6-158.2: 8 % less.
  So are ``InferRequest`` and ``InferResponse`` (protocol/types.py): as dataclasses, making them took
  4,100 and about 5,400 of the instructions of a `tiny` request over JSON, compiled 224 and 240
  (callgrind, in-process requests through the HTTP protocol). Configuration and policy objects made
  once (``HttpLimits``, ``BatchPolicy``, ``TensorSpec``) stay dataclasses.

  The records every request and batch leave (``metrics.py``'s counters and histograms, ``batching/
  stats.py``'s statistics) are compiled too. They took 1.44 us per request and 1.22-1.28 us per batch
  as Python, and 0.72-0.75 us and 0.34 us compiled. That was measured with ``timeit`` through
  ``BatchRecorder``, two rounds alternating. It is about 1 % of what `tiny` costs the loop per request
  near saturation. ``server/idle_poll.py`` is not: its tests subclass ``IdlePoll`` to count its turns,
  and an interpreted class cannot subclass a compiled one.
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
    "edgeinfer/server/http_protocol.py",
    "edgeinfer/server/http_routes.py",
    "edgeinfer/service.py",
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
