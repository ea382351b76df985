"""The `splitserve` command. The only layer that reads `SPLITSERVE_*` environment variables."""
