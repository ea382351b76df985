"""gRPC stubs generated from proto/splitserve/v1 (committed)."""
