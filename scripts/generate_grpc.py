"""Generate the protobuf modules from proto/edgeinfer_grpc_v2.proto and proto/edgeinfer_rollouts.proto
(needs grpcio-tools).

    python scripts/generate_grpc.py

Writes src/edgeinfer/protocol/grpc_gen/edgeinfer_{grpc_v2,rollouts}_pb2.py and their .pyi stubs. The output is
committed; lint skips it. No *_pb2_grpc.py is generated: the server registers generic handlers under
Triton's service path itself (see src/edgeinfer/server/grpc.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "edgeinfer" / "protocol" / "grpc_gen"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    note = '"""Generated protobuf code; do not edit. See scripts/generate_grpc.py."""\n'
    (OUT / "__init__.py").write_text(note)
    return protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            "edgeinfer_grpc_v2.proto",
            "edgeinfer_rollouts.proto",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
