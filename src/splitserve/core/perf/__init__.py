"""Latency models: how long an engine step takes for a given batch shape.

Roofline (analytical), profiled tables (interpolated), a fit to measured step times, and models
built from published GPU measurements (DistServe's A100 fits, Vidur's A100 / H100 operator
tables), chosen by name through `catalog`; KV-transfer costs from measured links (`kvlink`).
"""

from splitserve.core.perf.catalog import (
    LATENCY_MODELS,
    LinkedModel,
    OverheadModel,
    RescaledModel,
    TimeScaledModel,
    build_latency_model,
)
from splitserve.core.perf.distserve import DistServeModel
from splitserve.core.perf.fit import FittedModel, StepSample, fit
from splitserve.core.perf.kvlink import KV_LINKS, KvLink, LinearLink, MeasuredLink, kv_link
from splitserve.core.perf.protocol import BatchShape, LatencyModel
from splitserve.core.perf.roofline import RooflineModel
from splitserve.core.perf.shapes import HARDWARE, MODELS, HardwareSpec, ModelShape
from splitserve.core.perf.table import ProfileCurve, ProfiledModel, parse_profile_csv
from splitserve.core.perf.vidur import VidurModel

__all__ = [
    "HARDWARE",
    "KV_LINKS",
    "LATENCY_MODELS",
    "MODELS",
    "BatchShape",
    "DistServeModel",
    "FittedModel",
    "HardwareSpec",
    "KvLink",
    "LatencyModel",
    "LinearLink",
    "LinkedModel",
    "MeasuredLink",
    "ModelShape",
    "OverheadModel",
    "ProfileCurve",
    "ProfiledModel",
    "RescaledModel",
    "RooflineModel",
    "StepSample",
    "TimeScaledModel",
    "VidurModel",
    "build_latency_model",
    "fit",
    "kv_link",
    "parse_profile_csv",
]
