"""Latency models: how long an engine step takes for a given batch shape.

Roofline (analytical), profiled tables (interpolated) and a fit to measured step times.
"""

from splitserve.core.perf.fit import FittedModel, StepSample, fit
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.shapes import HARDWARE, MODELS, HardwareSpec, ModelShape
from splitserve.core.perf.table import ProfileCurve, ProfiledModel, parse_profile_csv

__all__ = [
    "HARDWARE",
    "MODELS",
    "BatchShape",
    "FittedModel",
    "HardwareSpec",
    "LatencyModel",
    "ModelShape",
    "ProfileCurve",
    "ProfiledModel",
    "RooflineModel",
    "StepSample",
    "fit",
    "parse_profile_csv",
]
