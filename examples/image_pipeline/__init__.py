"""The image pipeline example: decode and resize (Python), classify (ONNX), top-k labels (Python)."""
