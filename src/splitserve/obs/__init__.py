"""Observability: metric names (all under `splitserve_`), logging setup."""
