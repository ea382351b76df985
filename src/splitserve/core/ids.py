"""Identifiers as distinct types, so a request id is never passed where an endpoint id belongs."""

from __future__ import annotations

from typing import NewType

RequestId = NewType("RequestId", str)
EndpointId = NewType("EndpointId", str)
"""A worker endpoint, as the router knows it (its gRPC address in practice)."""
PoolName = NewType("PoolName", str)
SloClassName = NewType("SloClassName", str)
