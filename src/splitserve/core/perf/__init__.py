"""Latency models: how long an engine step takes for a given batch shape."""

from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.shapes import HARDWARE, MODELS, HardwareSpec, ModelShape

__all__ = [
    "HARDWARE",
    "MODELS",
    "BatchShape",
    "HardwareSpec",
    "LatencyModel",
    "ModelShape",
    "RooflineModel",
]
