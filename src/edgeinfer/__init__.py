"""edgeinfer: a small, fast Open Inference Protocol (KServe V2) server for ONNX models."""

__version__ = "0.1.0"
