"""The one part of edgeinfer in C: protocol/_jsonscan.c, parsing the numbers of large JSON bodies without
the GIL (protocol/json_scan.py). It is optional: where no C compiler is found the build goes on without
it, and JSON bodies are decoded on the event loop as before. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "edgeinfer.protocol._jsonscan",
            sources=["src/edgeinfer/protocol/_jsonscan.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        )
    ]
)
