#!/bin/sh
# Make the image's virtual environment smaller without changing what serves (run in the build stage):
# 194 MB -> about 120 MB with the CPU dependencies. Everything removed here is for building, testing or
# debugging the packages, never imported by `edgeinfer serve`.
set -eu
venv="$1"
site="$(echo "$venv"/lib/python3*/site-packages)"
"$venv/bin/pip" uninstall --yes --quiet pip setuptools
# Debug symbols in extension modules (uvloop's 13.6 MB library is 1.6 MB without them). Only the modules
# themselves: the vendored libraries in *.libs/ were rewritten by auditwheel and are left as they are.
find "$site" -type f \( -name '*.cpython-*.so' -o -name '*.abi3.so' \) -exec strip --strip-unneeded {} +
# Test suites, and C/C++/Cython sources and headers shipped inside wheels.
find "$site" -depth -type d -name tests -exec rm -rf {} +
find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.hpp' \
    -o -name '*.c' -o -name '*.cpp' \) -delete
# ONNX Runtime's Python module has the runtime linked in: its separate C library (35 MB, for programs that
# use the C API) and its offline tools (quantization, transformer optimizers) are not needed to serve.
rm -rf "$site"/onnxruntime/capi/libonnxruntime.so.* "$site"/onnxruntime/tools \
    "$site"/onnxruntime/transformers "$site"/onnxruntime/quantization
