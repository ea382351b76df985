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
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the emulator lives with the tests

from tests.fakes.kube import FakeWorkers, worker_pod  # noqa: E402
from tests.integration.operator.conftest import KmockServer, _write_kubeconfig  # noqa: E402

from splitserve.api import v1alpha1 as v1  # noqa: E402
from splitserve.operator import handlers  # noqa: E402
from splitserve.operator.kube import RestKube  # noqa: E402
from splitserve.operator.reconcile import Settings  # noqa: E402

NS = "default"


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


def ours(call: Any) -> bool:
    return str(call.user_agent).startswith(("kopf/", "splitserve-operator"))


def measure(n: int, window_s: float, interval_s: float, cache: bool) -> dict[str, float] | None:
    from kopf.testing import KopfRunner

    server = KmockServer().start()
    kubeconfig = Path(tempfile.mkdtemp(prefix="splitserve-idle-")) / "kubeconfig"
    _write_kubeconfig(kubeconfig, server.url)
    os.environ["KUBECONFIG"] = str(kubeconfig)
    import kubernetes

    kube = RestKube(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
    kube.client.user_agent = "bench"
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
    result: dict[str, float] | None = None
    try:
        with KopfRunner(args, timeout=120, registry=registry):
            for i in range(n):
                name = f"s{i}"
                kube.create(body(name))
                for j in range(2):
                    pod = worker_pod(name, "w", f"{name}-w-{j}", ip=f"10.{i // 250}.{i % 250}.{j}")
                    status = pod.pop("status")
                    kube.create(pod)
                    kube.patch(
                        "v1", "Pod", NS, pod["metadata"]["name"], {"status": status}, "status"
                    )
            settle(server, n, interval_s)
            before = [c for c in server.calls() if ours(c)]
            time.sleep(window_s)
            during = [c for c in server.calls() if ours(c)][len(before) :]
            result = summary(during, n, window_s)
    except Exception:
        if result is None:
            raise
        # Stopping many daemons can outlast the runner's timeout; the count is taken already.
        logging.warning("the operator did not stop cleanly", exc_info=True)
    finally:
        server.stop()
    return result


def settle(server: KmockServer, n: int, interval_s: float) -> None:
    """Until every service has its status and two intervals pass without a write."""
    deadline = time.monotonic() + 600
    quiet_for = 2 * interval_s + 1
    last_writes, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        calls = [c for c in server.calls() if ours(c)]
        writes = sum(1 for c in calls if c.method in ("POST", "PATCH", "DELETE"))
        statuses = {
            c.path for c in calls if c.path.endswith("/status") and "llmservices/" in c.path
        }
        if writes != last_writes or len(statuses) < n:
            last_writes, quiet_since = writes, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_for:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{n} services did not settle in 600 s")


def summary(during: list[Any], n: int, window_s: float) -> dict[str, float]:
    per_min = 60.0 / window_s
    writes = [c for c in during if c.method in ("POST", "PATCH", "DELETE")]
    watches = [c for c in during if c.params.get("watch") in ("true", "1")]
    return {
        "requests_per_min": len(during) * per_min,
        "per_service_per_min": len(during) * per_min / n,
        "writes_per_min": len(writes) * per_min,
        "watches_per_min": len(watches) * per_min,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--window", type=float, default=60.0, help="seconds counted")
    parser.add_argument("--interval", type=float, default=5.0, help="the operator's --interval")
    parser.add_argument("--no-cache", action="store_true", help="every read is a request")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print("| services | cache | requests / min | per service / min | writes / min |")
    print("|---:|---|---:|---:|---:|")
    for n in args.services:
        r = measure(n, args.window, args.interval, not args.no_cache)
        assert r is not None
        print(
            f"| {n} | {'off' if args.no_cache else 'watch-fed'} | {r['requests_per_min']:.1f} "
            f"| {r['per_service_per_min']:.2f} | {r['writes_per_min']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
