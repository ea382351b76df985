"""SLO classes as the router uses them, and how a request's class and overrides are resolved.

A class has latency targets (TTFT and TPOT, seconds, at `percentile`) or a job-completion
deadline (offline classes), an attainment target, a priority (higher first) and whether its
requests may be shed (HTTP 429) when they cannot meet their SLO.

Per-request overrides (`x-slo-ttft-ms`, `x-slo-tpot-ms`) act only for classes with
`allow_overrides`, and only within [target / OVERRIDE_FACTOR, target * OVERRIDE_FACTOR]: a client
can tighten or loosen its own deadline, not turn a batch request into an interactive one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from splitserve.core.errors import ConfigError

OVERRIDE_FACTOR = 4.0
"""Overrides lie within [target / 4, target * 4] of the class's own target."""


class UnknownSloClass(ConfigError):  # noqa: N818 - a lookup miss, reads as a condition
    """A request named a class the service does not declare."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(f"unknown SLO class {name!r}; known classes: {', '.join(sorted(known))}")
        self.name = name


class BadOverride(ConfigError):  # noqa: N818
    """A per-request SLO override the class does not allow, or out of its bounds."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class SloPolicyClass:
    name: str
    ttft_s: float | None = 2.0
    """TTFT target; None for offline classes (job completion only)."""
    tpot_s: float | None = 0.2
    percentile: float = 0.9
    attainment: float = 0.9
    """Fraction of requests that must meet both targets."""
    priority: int = 0
    """Higher is served first when the router queues."""
    sheddable: bool = False
    job_completion_s: float | None = None
    """Offline classes: every request must finish within this of its arrival."""
    allow_overrides: bool = False

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "job_completion_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"SLO class {self.name!r}: {name} must be > 0, got {v}")
        if (self.ttft_s is None or self.tpot_s is None) and self.job_completion_s is None:
            raise ConfigError(
                f"SLO class {self.name!r}: set ttft and tpot targets, or a job-completion deadline"
            )
        if self.allow_overrides and self.ttft_s is None and self.tpot_s is None:
            raise ConfigError(
                f"SLO class {self.name!r}: allowOverrides needs a ttft or tpot target (an "
                "offline class has no latency target to override)"
            )
        if not 0 < self.attainment <= 1 or not 0 < self.percentile <= 1:
            raise ConfigError(f"SLO class {self.name!r}: attainment and percentile in (0, 1]")


@dataclass(frozen=True, slots=True)
class SloOverrides:
    """What a request asked for on top of its class (None: the class's target)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


DEFAULT_CLASS = SloPolicyClass(name="default", ttft_s=2.0, tpot_s=0.2)
"""The class of a service that declares none (the CRD's documented default)."""


class SloClassTable:
    """The service's classes by name, and its default class."""

    def __init__(self, classes: Iterable[SloPolicyClass] = (), default: str | None = None) -> None:
        self.classes: Mapping[str, SloPolicyClass] = {c.name: c for c in classes}
        if not self.classes:
            self.classes = {DEFAULT_CLASS.name: DEFAULT_CLASS}
        if default is None:
            default = next(iter(self.classes))
        if default not in self.classes:
            raise ConfigError(f"defaultSloClass {default!r} is not one of the SLO classes")
        self.default = self.classes[default]

    def names(self) -> tuple[str, ...]:
        return tuple(self.classes)

    def resolve(self, name: str | None) -> SloPolicyClass:
        """The named class; the default when `name` is empty or None.

        Raises:
            UnknownSloClass: the service declares no such class.
        """
        if not name:
            return self.default
        try:
            return self.classes[name]
        except KeyError:
            raise UnknownSloClass(name, self.classes) from None

    def label(self, name: str) -> str:
        """A bounded metric label: the class name when declared, `other` beyond."""
        return name if name in self.classes else "other"

    @staticmethod
    def check_overrides(cls: SloPolicyClass, overrides: SloOverrides) -> SloOverrides:
        """`overrides` if the class allows them and each lies within its bounds.

        Raises:
            BadOverride: naming the header (`x-slo-ttft-ms` / `x-slo-tpot-ms`).
        """
        for header, value, target in (
            ("x-slo-ttft-ms", overrides.ttft_s, cls.ttft_s),
            ("x-slo-tpot-ms", overrides.tpot_s, cls.tpot_s),
        ):
            if value is None:
                continue
            if not cls.allow_overrides:
                raise BadOverride(header, f"{header}: SLO class {cls.name!r} allows no overrides")
            if target is None:
                raise BadOverride(header, f"{header}: SLO class {cls.name!r} has no such target")
            lo, hi = target / OVERRIDE_FACTOR, target * OVERRIDE_FACTOR
            if not lo <= value <= hi:
                raise BadOverride(
                    header,
                    f"{header}: {value * 1000:g} ms is outside [{lo * 1000:g}, {hi * 1000:g}] ms "
                    f"allowed for SLO class {cls.name!r}",
                )
        return overrides
