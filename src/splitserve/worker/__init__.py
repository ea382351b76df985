"""The worker edge: a gRPC server over one `Engine` (simulated or vLLM)."""
