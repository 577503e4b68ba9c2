"""Seed 001's serve script: two versions of one service registered from code, dynamic batching on.

    python examples/seed_service/serve.py [PORT]          (default 8080; Ctrl-C stops it)

    curl -X POST http://localhost:8080/v2/models/resnet18-classifier/versions/1.0/infer \\
         -H "Content-Type: application/json" -d '{"parameters": {"url": "http://127.0.0.1:8000/cat.png"}}'
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from image_service import ImageClassificationService, ImageClassificationServiceV2

import edgeinfer

# max_batch_size / max_batch_time as the seed's ModelSettings: up to 32 requests, waiting at most 0.1 s
settings = {"max_batch_size": 32, "max_batch_time": 0.1}
server = edgeinfer.Server()
server.register(ImageClassificationService(), name="resnet18-classifier", version="1.0", **settings)
# the same name again, another version: "for A/B testing or gradual release"
server.register(ImageClassificationServiceV2(), name="resnet18-classifier", version="2.0", **settings)

if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    server.run(http_port=port, grpc_port=None, metrics_port=None)
