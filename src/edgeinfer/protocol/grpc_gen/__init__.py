"""Generated protobuf code; do not edit. See scripts/generate_grpc.py."""
