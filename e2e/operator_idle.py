"""API requests an idle operator makes, per service, on the kmock emulator.

Starts kmock (the integration tests' emulator) and the real operator (kopf, `--namespace
default`), creates N services with their worker pods ready and roles assigned, waits until the
operator stops writing, then counts the requests it sends during a window (by User-Agent: the
operator's client and kopf's). Watches are counted as requests when they are opened.

    python e2e/operator_idle.py --services 1 10 100 --window 60 [--no-cache]

Prints one Markdown table row per N. Numbers depend on the interval (`--interval`, the
operator's default 5 s) and not on the machine: requests are counted, not timed.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the emulator lives with the tests

from tests.fakes.kube import FakeWorkers, worker_pod  # noqa: E402
from tests.fakes.router_metrics import FakeRouterMetrics  # noqa: E402
from tests.integration.operator.conftest import KmockServer, _write_kubeconfig  # noqa: E402

from splitserve.api import v1alpha1 as v1  # noqa: E402
from splitserve.core.roles import Role  # noqa: E402
from splitserve.operator import handlers  # noqa: E402
from splitserve.operator.control import runtime  # noqa: E402
from splitserve.operator.kube import RestKube  # noqa: E402
from splitserve.operator.reconcile import Settings  # noqa: E402
from splitserve.policy.planner.signals import WorkerLoad  # noqa: E402

NS = "default"
CONTROL_INTERVAL_S = 30.0
"""`scaling.intervalSeconds`'s default: how often the control loop ticks."""
WRITES = ("POST", "PATCH", "PUT", "DELETE")
"""The methods that write (the settle wait counted PUT, the window's count did not)."""


def body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"name": "m", "source": "org/m"},
            "engine": {"kind": "sim", "image": "img:1"},
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
            "scaling": {"mode": "Manual"},
        },
    }


class IdleLoads:
    """Every worker answers its load report: idle (no request in flight)."""

    def load(self, address: str) -> WorkerLoad:
        return WorkerLoad(address, Role.MIXED, 0, 1, 0.0)


def create_pod(kube: RestKube, pod: dict[str, Any]) -> None:
    status = pod.pop("status")
    kube.create(pod)
    kube.patch("v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status")


def ours(call: Any) -> bool:
    return str(call.user_agent).startswith(("kopf/", "splitserve-operator"))


def measure(
    n: int, window_s: float, interval_s: float, cache: bool, settle_s: float
) -> dict[str, Any] | None:
    from kopf.testing import KopfRunner

    server = KmockServer().start()
    kubeconfig = Path(tempfile.mkdtemp(prefix="splitserve-idle-")) / "kubeconfig"
    _write_kubeconfig(kubeconfig, server.url)
    os.environ["KUBECONFIG"] = str(kubeconfig)
    import kubernetes

    kube = RestKube(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
    kube.client.user_agent = "bench"
    metrics = FakeRouterMetrics()
    runtime.configure(runtime.ControlConfig(get=lambda url: metrics.text(), loads=IdleLoads()))
    registry = handlers.registry(
        handlers.OperatorConfig(
            settings=Settings(router_image="router:1", drain_wait_s=0.0),
            interval_s=interval_s,
            kubeconfig=str(kubeconfig),
            workers=FakeWorkers(),
            cache=cache,
        )
    )
    args = ["run", "--quiet", "--standalone", "-n", NS]
    result: dict[str, Any] | None = None
    try:
        with KopfRunner(args, timeout=120, registry=registry):
            started = time.monotonic()
            for i in range(n):
                server.archive()  # keeps kmock's cost per request flat (see KmockThread)
                if i and i % 10 == 0:
                    logging.warning(
                        "created %d/%d services in %.0f s", i, n, time.monotonic() - started
                    )
                name = f"s{i}"
                kube.create(body(name))
                for j in range(2):
                    ip = f"10.{i // 250}.{i % 250}.{j}"
                    create_pod(kube, worker_pod(name, "w", f"{name}-w-{j}", ip=ip))
                # A ready router pod (its /metrics: an idle router's), as the Deployment and a
                # kubelet would make it.
                router = worker_pod(name, "w", f"{name}-router-0", ip=f"10.{i // 250}.{i % 250}.9")
                router["metadata"]["labels"][v1.LABEL_COMPONENT] = "router"
                create_pod(kube, router)
            logging.warning("created %d services in %.0f s", n, time.monotonic() - started)
            started = time.monotonic()
            unsettled = settle(server, kube, n, interval_s, settle_s)
            if unsettled:
                return {"unsettled": unsettled}
            settled_s = time.monotonic() - started
            before = [c for c in server.calls() if ours(c)]
            for _ in range(int(window_s)):
                time.sleep(1.0)
                server.archive()
            time.sleep(window_s - int(window_s))
            during = [c for c in server.calls() if ours(c)][len(before) :]
            result = {**summary(during, n, window_s), "settle_s": settled_s}
    except Exception:
        if result is None:
            raise
        # Stopping many daemons can outlast the runner's timeout; the count is taken already.
        logging.warning("the operator did not stop cleanly", exc_info=True)
    finally:
        server.stop()
    return result


def settle(server: KmockServer, kube: RestKube, n: int, interval_s: float, timeout_s: float) -> str:
    """Wait until every service has a status written for its current generation and two
    intervals pass without a write by the operator; at most `timeout_s`. Returns "" when
    settled, else what was still moving (the row says so instead of a number)."""
    deadline = time.monotonic() + timeout_s
    # The control loop ticks every `scaling.intervalSeconds` (30 s by default) and writes when
    # what it holds for changes (its first ticks), so quiet means two of its ticks too.
    quiet_for = 2 * max(interval_s, CONTROL_INTERVAL_S) + 1
    last_writes, quiet_since, next_report = -1, time.monotonic(), time.monotonic() + 30
    observed = 0
    recent: list[str] = []
    while time.monotonic() < deadline:
        server.archive()
        calls = [c for c in server.calls() if ours(c)]
        writes = [c for c in calls if c.method in WRITES]
        observed = sum(1 for svc in kube.list(v1.API_VERSION, "LLMService", NS) if _observed(svc))
        if len(writes) != last_writes or observed < n:
            recent = [f"{c.method} {c.path}" for c in writes[max(last_writes, 0) :]][-5:]
            last_writes, quiet_since = len(writes), time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_for:
            return ""
        if time.monotonic() >= next_report:
            next_report += 30
            logging.warning(
                "%d services: %d/%d with status, %d writes", n, observed, n, last_writes
            )
        time.sleep(1.0)
    return (
        f"did not settle in {timeout_s:.0f} s: {observed}/{n} services with a status, "
        f"last writes {recent}"
    )


def _observed(svc: dict[str, Any]) -> bool:
    status = svc.get("status") or {}
    generation = (svc.get("metadata") or {}).get("generation")
    return bool(status.get("conditions")) and status.get("observedGeneration") == generation


def summary(during: list[Any], n: int, window_s: float) -> dict[str, float]:
    per_min = 60.0 / window_s
    writes = [c for c in during if c.method in WRITES]
    watches = [c for c in during if c.params.get("watch") in ("true", "1")]
    return {
        "requests_per_min": len(during) * per_min,
        "per_service_per_min": len(during) * per_min / n,
        "writes_per_min": len(writes) * per_min,
        "watches_per_min": len(watches) * per_min,
    }


def _number(low: float, strict: bool) -> Any:
    """An argparse type: a finite number above `low` (`strict`) or at least `low`."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a finite number {'>' if strict else '>='} {low:g}"
            )
        return value

    return convert


def _services(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def main(argv: list[str] | None = None) -> None:
    """A bad option is a one-line usage error before anything starts (`--services 0` and
    `--window 0` were a ZeroDivisionError after the settle wait; a negative window a
    ValueError)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=_services, nargs="+", default=[1, 10, 100])
    parser.add_argument(
        "--window", type=_number(0, strict=True), default=60.0, help="seconds counted"
    )
    parser.add_argument(
        "--interval",
        type=_number(0, strict=True),
        default=5.0,
        help="the operator's --interval",
    )
    parser.add_argument("--no-cache", action="store_true", help="every read is a request")
    parser.add_argument(
        "--settle-timeout",
        type=_number(0, strict=False),
        default=300.0,
        help="seconds to wait for the idle state",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(
        "| services | cache | requests / min | per service / min | writes / min "
        "| watch (re)opens / min | settle s |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.services:
        r = measure(n, args.window, args.interval, not args.no_cache, args.settle_timeout)
        assert r is not None
        if "unsettled" in r:
            print(f"| {n} | {'off' if args.no_cache else 'watch-fed'} | {r['unsettled']} |||||")
            continue
        print(
            f"| {n} | {'off' if args.no_cache else 'watch-fed'} | {r['requests_per_min']:.1f} "
            f"| {r['per_service_per_min']:.2f} | {r['writes_per_min']:.1f} "
            f"| {r['watches_per_min']:.1f} | {r['settle_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
