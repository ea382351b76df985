"""Router metrics -> the control loop's `Observation` (policy.planner.signals).

The routers export cumulative counters and histograms (names in METRICS_CONTRACT, `RouterMetrics`
in obs/metrics.py). One scrape of every router is a `Snapshot`; the `Window` keeps the snapshots
of the last `window_s` per service and turns the difference between the newest and the oldest
into per-class TTFT / TPOT percentiles (histogram buckets, interpolated as Prometheus'
`histogram_quantile` does), attainment, goodput, arrival rate, length mix, queue depth and shed
count. A router whose counters went down restarted: its newest values count from zero, as
Prometheus' `increase` does.

Missing or stale data is explicit: no router answered, a router did not answer this time, the
SLO metrics are absent (a router without them; an idle router that declares them with no
sample yet is "no traffic yet", `Scrape`), or only one snapshot so far (rates need two).
Each becomes a `SignalProblem`, and the policies then hold. Arrivals counted with no request
finished yet are not a problem but a known state (`Observation.no_finish_yet`: no SLO result
and no output length yet), on which the autoscaler acts through the router's queue.

The busiest sub-window's arrival rate (`Observation.arrival_rate_peak_per_s`, the autoscaler's
burst headroom) comes from the admission counter's values over the window (`busiest_rate`):
the snapshots' own (direct scrapes, one per tick) or Prometheus' raw samples of the window
(`Snapshot.admissions`). Its resolution is the coarser of `peak_window_s` and the spacing of
those values (a tick interval, a Prometheus scrape interval). When it cannot be measured it is
`None` with the reason in `Observation.peak_problem`: the policy then sizes on the mean (and says
so), it never reads a zero.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from splitserve.core.roles import Role
from splitserve.policy.planner.signals import (
    ClassSignal,
    Observation,
    PoolSignal,
    SignalProblem,
    SignalState,
)

P = "splitserve_router_"
ADMISSION = P + "admission_total"
REQUESTS = P + "requests_total"
SLO_REQUESTS = P + "slo_requests_total"
QUEUE_DEPTH = P + "queue_depth"
QUEUED_PROMPT_TOKENS = P + "queued_prompt_tokens"
TTFT = P + "ttft_seconds"
TPOT = P + "tpot_seconds"
PROMPT_LEN = P + "prompt_length_tokens"
OUTPUT_LEN = P + "output_length_tokens"
REQUIRED = (ADMISSION, SLO_REQUESTS)
"""Without these the loop cannot see load or SLOs (a router without the SLO metrics)."""

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


class Scrape(dict[tuple[str, Labels], float]):
    """The samples of one router's own exposition (`parse`), and the metric families it
    declares: a labelled counter has no sample before its first increment, so an idle router
    declares `splitserve_router_admission_total` with no sample (no traffic yet), where a
    router without the SLO metrics does not declare it. Samples read from Prometheus are a
    plain dict: it keeps no series without a sample, so the two cannot be told apart there."""

    declared: frozenset[str] = frozenset()


def parse(text: str) -> Scrape:
    """Every sample of a Prometheus text exposition, keyed by (sample name, sorted labels),
    and the families it declares (`Scrape.declared`, counters under their `_total` name)."""
    out = Scrape()
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        if family.type == "counter":
            declared.add(family.name + "_total")
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    out.declared = frozenset(declared)
    return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape of the service's routers."""

    time_s: float
    routers: Mapping[str, Samples]
    """Router address -> its samples (only routers that answered)."""
    failed: Mapping[str, str] = field(default_factory=dict)
    """Router address -> why it did not answer."""
    admissions: Mapping[str, Sequence[tuple[float, float]]] | None = None
    """Raw (time, cumulative admissions) samples of the window per router, on this snapshot's
    clock, where the source has them (Prometheus); None: the peak comes from the window's
    snapshots."""
    admissions_problem: str | None = None
    """Why `admissions` could not be read (the peak is then unknown, not the snapshots')."""


def _increase(new: Samples, old: Samples | None) -> Samples:
    """Per-series increase of cumulative values; a decrease means a restart (count from 0)."""
    out: Samples = {}
    for key, v in new.items():
        before = (old or {}).get(key)
        out[key] = v if before is None or v < before else v - before
    return out


def _sum(samples: Samples, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == want for k, want in match.items())
    )


def _has(samples: Samples, name: str) -> bool:
    return any(n == name for n, _ in samples)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' `histogram_quantile` over (upper bound, cumulative count) pairs."""
    pts = sorted(buckets)
    if not pts or pts[-1][1] <= 0:
        return None
    total = pts[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in pts:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # in the +Inf bucket: the largest finite bound, as Prometheus
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def _quantile(samples: Samples, name: str, q: float, **match: str) -> float | None:
    by_le: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n != name + "_bucket":
            continue
        d = dict(labels)
        if all(d.get(k) == want for k, want in match.items()):
            le = float(d["le"])
            by_le[le] = by_le.get(le, 0.0) + v
    return histogram_quantile(q, list(by_le.items()))


def _monotone(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """A cumulative counter's samples, sorted, with restarts (a value going down) counted from
    zero as Prometheus' `increase` does."""
    out: list[tuple[float, float]] = []
    offset = 0.0
    prev: float | None = None
    for t, v in sorted(points):
        if prev is not None and v < prev:
            offset += prev
        prev = v
        out.append((t, v + offset))
    return out


def _at(points: Sequence[tuple[float, float]], t: float) -> float:
    """The counter at `t`, linear between samples, flat outside them."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return points[-1][1]


def busiest_rate(
    series: Mapping[str, Sequence[tuple[float, float]]], end_s: float, span_s: float, sub_s: float
) -> tuple[float | None, str]:
    """`busiest_rate_over` without the sub-window's length."""
    rate, why, _ = busiest_rate_over(series, end_s, span_s, sub_s)
    return rate, why


def busiest_rate_over(
    series: Mapping[str, Sequence[tuple[float, float]]], end_s: float, span_s: float, sub_s: float
) -> tuple[float | None, str, float]:
    """The highest arrival rate over the sub-windows tiling `(end_s - span_s, end_s]`, newest
    first, from cumulative counters sampled per router: `(rate, "", sub-window length)`, or
    `(None, why, sub-window length)` (the length the autoscaler's Poisson deduction needs).

    A sub-window is `sub_s` long, or the largest spacing between two samples of one router when
    that is longer (a finer peak is not in the data). The routers' counters are summed at the
    sub-windows' edges, each interpolated linearly between its own samples (routers scraped at
    different instants); a router's counter before its first sample is its first value (its
    arrivals before are unknown, so not counted). Approximation: arrivals between two samples
    are spread evenly over them.
    """
    pts = {k: _monotone(v) for k, v in series.items() if len(v) >= 2}
    if not pts:
        return None, "fewer than two samples of the admission counter in the window", sub_s
    gap = max(t1 - t0 for p in pts.values() for (t0, _), (t1, _) in itertools.pairwise(p))
    step = max(sub_s, gap)
    first = min(p[0][0] for p in pts.values())
    start = max(end_s - span_s, first)
    k = int((end_s - start) / step + 1e-6)
    if k < 1:
        return None, f"the window's samples span less than one {step:g} s sub-window", step
    edges = [end_s - i * step for i in range(k + 1)]
    totals = [sum(_at(p, t) for p in pts.values()) for t in edges]
    return max(a - b for a, b in itertools.pairwise(totals)) / step, "", step


def histogram_cv2(samples: Samples, name: str) -> float | None:
    """Squared coefficient of variation (variance / mean²) of a histogram's observations, read
    so that a heavy tail is not underestimated (the prefill pool is sized for the tail this
    spread implies, `policy.planner.autoscaler.prefill_tail_utilization`).

    Each finite bucket `(lo, hi]` counts at its midpoint for the mean and with the largest spread
    a bucket allows around that midpoint for the second moment (half its observations at each
    bound: `mid² + (hi − lo)² / 4`); the +Inf bucket's mean is what the histogram's exact
    `_sum` leaves after the finite buckets (at least its lower bound), spread as an exponential
    excess over that bound (`m² + (m − lo)²`; without a `_sum`, at its lower bound).

    Measured against the exact value (1,500 random lognormal lengths and two-component mixtures
    within the router's buckets, <= 32,768 tokens; tests/unit/operator/test_prompt_spread.py
    checks it with hypothesis): at least 0.76× the exact spread, 0.95× at the 5th percentile,
    median 1.26×, where the midpoint reading it replaces (every observation at its bucket's
    midpoint, the +Inf bucket at its lower bound) fell to 0.82× at the 5th percentile. One
    corner reads lower: a body of ~20-token prompts with a very wide spread (lognormal μ 3-3.5,
    σ 1.3-2.5, cv² ~40-60, a few prompts of thousands of tokens dominating the second moment
    from the top of the widest buckets) reads down to 0.67× (3,000 draws: 0.07 % below 0.7×,
    1st percentile 0.83×; found by the hypothesis test in a clean-clone run, 2026-11-27). A
    second corner reads lower still: a narrow body just above a bucket's lower bound with 1 %
    far outliers (lognormal μ 7, σ 0.06, i.e. ~1,100 tokens in the (1024, 2048] bucket, and 1 %
    near 22,000 tokens) reads 0.55-0.6× (1.14 for 1.93): the body's mean is read at its bucket's
    midpoint, ~1.4× high, which shrinks the outliers' relative spread (found by hypothesis,
    2026-11-28). Fitting one in-bucket position to the exact `_sum` instead of the midpoints does
    not fix it (tried 2026-11-29: the corner still reads 0.51× at worst in a grid of it, since one
    position cannot put the body at its bucket's bottom and the outliers a third of the way up
    theirs; over 3,000 random cases the worst reading moved from 0.746× to 0.756×): not adopted.
    Approximations: a light spread inside one or two buckets reads high (a constant length
    0.11 instead of 0, 500-1,500 tokens uniform 0.24 instead of 0.08; a narrow body with 1 %
    far outliers up to 2.1×: more prefill headroom); a tail heavier than exponential beyond
    the last bucket still reads low (a σ 1.5 lognormal up to 128k tokens: 3.67 for 4.97; the
    midpoint reading gave 3.09). None: no observation."""
    by_le: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n == name + "_bucket":
            le = float(dict(labels)["le"])
            by_le[le] = by_le.get(le, 0.0) + v
    pts = sorted(by_le.items())
    if not pts or pts[-1][1] <= 0:
        return None
    total, first, second, lo, below = pts[-1][1], 0.0, 0.0, 0.0, 0.0
    tail_n, tail_lo = 0.0, 0.0
    for le, cum in pts:
        count = cum - below
        if count > 0:
            if math.isinf(le):
                tail_n, tail_lo = count, lo
            else:
                mid = (lo + le) / 2
                first += count * mid
                second += count * (mid * mid + (le - lo) ** 2 / 4)
        lo, below = (lo if math.isinf(le) else le), cum
    if tail_n > 0:
        exact_sum = _sum(samples, name + "_sum") if _has(samples, name + "_sum") else 0.0
        m = max(tail_lo, (exact_sum - first) / tail_n)
        first += tail_n * m
        second += tail_n * (m * m + (m - tail_lo) ** 2)
    mean = first / total
    return max(0.0, second / total / (mean * mean) - 1.0) if mean > 0 else None


@dataclass(frozen=True, slots=True)
class ClassTargets:
    """A class's targets from the `LLMService` spec (the source of truth)."""

    name: str
    ttft_s: float | None
    tpot_s: float | None
    percentile: float
    attainment: float


def _declares(samples: Samples, absent: Sequence[str]) -> bool:
    """Whether the router behind `samples` exports the `absent` families (without a sample).

    A direct scrape says so (`Scrape.declared`). Prometheus keeps no declarations, but the
    admission counter and the SLO results are one set (`obs.metrics.RouterMetrics` exports
    them together), so a pod with an admission series has the SLO metrics: only its results
    can be missing (none finished yet). Without one it may be idle or misconfigured."""
    if isinstance(samples, Scrape):
        return all(m in samples.declared for m in absent)
    return ADMISSION not in absent and _has(samples, ADMISSION)


def _required_missing(routers: Mapping[str, Samples]) -> tuple[list[SignalProblem], bool]:
    """Routers without a sample of a `REQUIRED` family, and whether no request finished yet.

    One that declares the families (`Scrape.declared`) has had no traffic (no admission
    sample) or no request finished yet (no SLO result): a normal state, no problem at all
    beside a router that has both samples (its zero is then known). When no router finished a
    request but one counted arrivals (each declaring the families), that is no problem either
    but `True`: the rate, prompts and queue are known, the SLO results and output lengths not
    (`Observation.no_finish_yet`; the autoscaler acts on the queue). Only when none counted an
    arrival is it "no traffic yet". One that does not declare them lacks the SLO metrics
    (misconfigured); from Prometheus (no declarations) a pod with admission series declares
    them (`_declares`), one without may be idle or misconfigured, and stays a problem."""
    out: list[SignalProblem] = []
    busy = any(all(_has(s, m) for m in REQUIRED) for s in routers.values())
    declared = [
        s for s in routers.values() if _declares(s, [m for m in REQUIRED if not _has(s, m)])
    ]
    arriving = (
        not busy
        and len(declared) == len(routers) > 0
        and any(_has(s, ADMISSION) for s in routers.values())
    )
    if arriving:
        return [], True
    for addr, samples in sorted(routers.items()):
        absent = [m for m in REQUIRED if not _has(samples, m)]
        if not absent:
            continue
        names = ", ".join(absent)
        if _declares(samples, absent):
            if busy:
                continue
            # Distinct signals, so a hold printed once per change of the problems
            # (`loop.held_key`) is printed again when the first requests arrive.
            what, why = (
                ("traffic", "no traffic yet")
                if ADMISSION in absent
                else ("SLO results", "no request finished yet")
            )
            out.append(
                SignalProblem(
                    f"router {addr} {what}",
                    SignalState.MISSING,
                    f"{why} (no {names} sample; the router declares the metrics)",
                )
            )
        elif isinstance(samples, Scrape):
            out.append(
                SignalProblem(
                    f"router {addr}",
                    SignalState.MISSING,
                    f"no {names} (a router without the SLO metrics)",
                )
            )
        else:
            out.append(
                SignalProblem(
                    f"router {addr}",
                    SignalState.MISSING,
                    f"no {names} series in Prometheus (no traffic yet, or a router without "
                    "the SLO metrics)",
                )
            )
    return out, False


class Window:
    """The snapshots of the last `window_s` of one service, and the Observation they give."""

    def __init__(self, window_s: float, max_age_s: float, peak_window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.max_age_s = max_age_s
        self.peak_window_s = peak_window_s
        """The sub-window whose busiest one gives `Observation.arrival_rate_peak_per_s`."""
        self.snapshots: deque[Snapshot] = deque()
        self.last_good_s: float | None = None
        """When every router last answered."""
        self.last_lengths: tuple[float, float] | None = None
        """The last known mean prompt / output lengths (an idle window has none)."""

    def add(self, snap: Snapshot) -> None:
        if snap.routers and not snap.failed:
            self.last_good_s = snap.time_s
        self.snapshots.append(snap)
        # Keep one snapshot at or before the window start (the base of the differences).
        while len(self.snapshots) > 2 and self.snapshots[1].time_s <= snap.time_s - self.window_s:
            self.snapshots.popleft()

    def observe(
        self,
        now_s: float,
        classes: Sequence[ClassTargets],
        pools: Mapping[Role, PoolSignal],
        extra_problems: Iterable[SignalProblem] = (),
    ) -> Observation:
        problems = list(extra_problems)
        if not self.snapshots:
            problems.append(SignalProblem("router metrics", SignalState.MISSING, "no scrape yet"))
            return Observation(
                now_s, self.window_s, None, None, None, (), pools, problems=tuple(problems)
            )
        new = self.snapshots[-1]
        age = now_s - self.last_good_s if self.last_good_s is not None else float("inf")
        if self.last_good_s is not None and age > self.max_age_s:
            problems.append(
                SignalProblem("router metrics", SignalState.STALE, f"last scrape {age:.0f} s ago")
            )
        for addr, why in sorted(new.failed.items()):
            problems.append(SignalProblem(f"router {addr}", SignalState.MISSING, why))
        if not new.routers and not new.failed:
            problems.append(
                SignalProblem("router metrics", SignalState.MISSING, "no ready router pod")
            )
        missing, no_finish_yet = _required_missing(new.routers)
        problems.extend(missing)
        old = self.snapshots[0] if len(self.snapshots) > 1 else None
        if old is None:
            problems.append(
                SignalProblem(
                    "router metrics", SignalState.MISSING, "one scrape so far (rates need two)"
                )
            )
            return Observation(
                now_s, self.window_s, None, None, None, (), pools, problems=tuple(problems)
            )
        span = new.time_s - old.time_s
        delta: Samples = {}
        for addr, samples in new.routers.items():
            for key, v in _increase(samples, old.routers.get(addr)).items():
                delta[key] = delta.get(key, 0.0) + v
        gauges: Samples = {}
        for samples in new.routers.values():
            for key, v in samples.items():
                gauges[key] = gauges.get(key, 0.0) + v

        arrivals = _sum(delta, ADMISSION)
        rate = arrivals / span if span > 0 else None
        n_prompt = _sum(delta, PROMPT_LEN + "_count")
        n_output = _sum(delta, OUTPUT_LEN + "_count")
        prompt = _sum(delta, PROMPT_LEN + "_sum") / n_prompt if n_prompt else None
        output = _sum(delta, OUTPUT_LEN + "_sum") / n_output if n_output else None
        if prompt is not None and output is not None:
            self.last_lengths = (prompt, output)
        elif self.last_lengths is not None:
            prompt = prompt if prompt is not None else self.last_lengths[0]
            output = output if output is not None else self.last_lengths[1]
        signals = []
        for c in classes:
            met = _sum(delta, SLO_REQUESTS, slo_class=c.name, result="met")
            missed = _sum(delta, SLO_REQUESTS, slo_class=c.name, result="missed")
            n = met + missed
            shed = _sum(delta, REQUESTS, slo_class=c.name, outcome="shed")
            signals.append(
                ClassSignal(
                    c.name,
                    c.ttft_s,
                    c.tpot_s,
                    c.percentile,
                    c.attainment,
                    requests=int(n),
                    ttft_s=_quantile(delta, TTFT, c.percentile, slo_class=c.name),
                    tpot_s=_quantile(delta, TPOT, c.percentile, slo_class=c.name),
                    attainment=met / n if n else None,
                    goodput_per_s=met / span if span > 0 else None,
                    shed=int(shed),
                )
            )
        # Shed = requests that ended with a 429: refused at arrival (the admission counter's
        # `shed` and `rejected`) and queued first, then shed (which the admission counter,
        # one decision per arrival, counts as `queued`): `requests_total{outcome="shed"}`.
        shed_all = _sum(delta, REQUESTS, outcome="shed")
        queue = (
            _sum(gauges, QUEUE_DEPTH)
            if any(_has(s, QUEUE_DEPTH) for s in new.routers.values())
            else None
        )
        queued_tokens = (
            _sum(gauges, QUEUED_PROMPT_TOKENS)
            if any(_has(s, QUEUED_PROMPT_TOKENS) for s in new.routers.values())
            else None
        )
        peak, peak_problem, peak_window = self._peak(new, span)
        cv2 = histogram_cv2(delta, PROMPT_LEN) if n_prompt else None
        return Observation(
            now_s,
            span,
            rate,
            prompt,
            output,
            tuple(signals),
            pools,
            router_queue=int(queue) if queue is not None else None,
            router_queued_prompt_tokens=int(queued_tokens) if queued_tokens is not None else None,
            shed=int(shed_all),
            problems=tuple(problems),
            arrival_rate_peak_per_s=peak,
            arrival_rate_peak_window_s=peak_window,
            peak_problem=peak_problem,
            prompt_tokens_cv2=cv2,
            no_finish_yet=no_finish_yet and output is None,
        )

    def _peak(
        self, new: Snapshot, span: float
    ) -> tuple[float | None, SignalProblem | None, float | None]:
        """The busiest sub-window of the window: from the source's raw samples when it gave
        them (Prometheus), else from the snapshots' admission counters."""
        name = "arrival rate peak"
        if new.admissions_problem is not None:
            return None, SignalProblem(name, SignalState.MISSING, new.admissions_problem), None
        if new.admissions is not None:
            series = new.admissions
            newest = max((t for p in series.values() for t, _ in p), default=None)
            if newest is not None and new.time_s - newest > self.max_age_s:
                age = new.time_s - newest
                stale = f"newest admission sample {age:.0f} s old"
                return None, SignalProblem(name, SignalState.STALE, stale), None
        else:
            snaps = [s for s in self.snapshots if s.time_s >= new.time_s - span - 1e-9]
            addrs = set(new.routers)
            series = {
                a: [(s.time_s, _sum(s.routers[a], ADMISSION)) for s in snaps if a in s.routers]
                for a in addrs
            }
        rate, why, sub_s = busiest_rate_over(series, new.time_s, span, self.peak_window_s)
        if rate is None:
            return None, SignalProblem(name, SignalState.MISSING, why), None
        return rate, None, sub_s
