"""`splitserve router serve --processes N`: N router processes on the same ports.

The supervisor picks the ports (binding port 0 with `SO_REUSEPORT` when asked for any port, and
keeping that socket so the port stays reserved), starts N children with the resolved
configuration and `--reuse-port`, restarts a child that dies (with back-off), and on SIGTERM /
SIGINT forwards the signal so each child drains (`edge.drain_grace_s`). Its ready file lists
the children once all of them listen.

Each child is a whole router with its own view of the pool: the workers' load reports are
shared, the in-flight work a child reserves is its own. Metrics are per process too: with a
`metrics_port` P, child i serves its `/metrics` on P + i (0: each on a free port of its own), so
every process can be scraped; the ready file lists them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from splitserve.api.router import RouterConfig
from splitserve.cli.process import die_with_parent, env_without_api_key

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0
_RESTART_MIN_S = 0.5
_RESTART_MAX_S = 10.0


def _reserve(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _child_config(config: RouterConfig, index: int) -> RouterConfig:
    """Child `index`'s configuration: its own metrics port (P + index; 0 stays 0)."""
    if not config.metrics_port:
        return config
    return config.model_copy(update={"metrics_port": config.metrics_port + index})


class _Child:
    def __init__(self, index: int, config_file: Path, work: Path) -> None:
        self.index = index
        self.config_file = config_file
        self.ready_file = work / f"ready-{index}.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.next_start_s = 0.0

    def start(self) -> None:
        self.ready_file.unlink(missing_ok=True)
        args = [
            sys.executable,
            "-c",
            "from splitserve.cli.main import main; main()",
            "router",
            "serve",
            "--config-json",
            str(self.config_file),
            "--reuse-port",
            "--ready-file",
            str(self.ready_file),
        ]
        self.proc = subprocess.Popen(args, env=env_without_api_key(), preexec_fn=die_with_parent)

    def info(self) -> dict[str, object] | None:
        if not self.ready_file.exists():
            return None
        data: dict[str, object] = json.loads(self.ready_file.read_text())
        return data


def supervise(config: RouterConfig, processes: int, ready_file: Path | None) -> None:
    """Run `processes` router processes until SIGTERM / SIGINT (then drain them all).

    Raises:
        SystemExit: the metrics ports P .. P + processes - 1 do not fit below 65536.
    """
    if config.metrics_port and config.metrics_port + processes - 1 > 65535:
        raise SystemExit(
            f"--metrics-port {config.metrics_port} with --processes {processes}: process i "
            "serves its metrics on the port + i, past 65535"
        )
    reserved = [_reserve(config.http_host, config.http_port)]
    updates: dict[str, object] = {"http_port": reserved[0].getsockname()[1]}
    if config.grpc_port is not None:
        reserved.append(_reserve(config.grpc_host, config.grpc_port))
        updates["grpc_port"] = reserved[1].getsockname()[1]
    resolved = config.model_copy(update=updates)
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)

    with tempfile.TemporaryDirectory(prefix="splitserve-router-") as tmp:
        work = Path(tmp)
        children = []
        for i in range(processes):
            config_file = work / f"config-{i}.json"
            config_file.write_text(_child_config(resolved, i).model_dump_json())
            children.append(_Child(i, config_file, work))
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for child in children:
            child.start()
        _wait_ready(children, resolved, ready_file)
        while not stopping:
            now = time.monotonic()
            for child in children:
                proc = child.proc
                if proc is not None and proc.poll() is not None and not stopping:
                    log.warning(
                        "router process %d (pid %d) exited with %s; restarting",
                        child.index,
                        proc.pid,
                        proc.returncode,
                    )
                    child.proc = None
                    delay = min(_RESTART_MAX_S, _RESTART_MIN_S * 2**child.restarts)
                    child.restarts += 1
                    child.next_start_s = now + delay
                if child.proc is None and now >= child.next_start_s and not stopping:
                    child.start()
            time.sleep(0.2)
        grace = resolved.edge.drain_grace_s + 10
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("router process %d did not drain in time; killing it", child.index)
                child.proc.kill()
                child.proc.wait()
    for sock in reserved:
        sock.close()


def _wait_ready(children: list[_Child], config: RouterConfig, ready_file: Path | None) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        infos = [c.info() for c in children]
        if all(i is not None for i in infos):
            break
        for child in children:
            if child.proc is not None and child.proc.poll() is not None:
                raise SystemExit(f"router process {child.index} failed to start")
        if time.monotonic() > deadline:
            raise SystemExit("router processes did not become ready in time")
        time.sleep(0.05)
    log.info(
        "%d router processes serving on http %s:%s grpc %s",
        len(children),
        config.http_host,
        config.http_port,
        config.grpc_port,
    )
    if ready_file is not None:
        info = {
            "host": config.http_host,
            "port": config.http_port,
            "grpc_port": config.grpc_port,
            "pid": os.getpid(),
            "pids": [c.proc.pid for c in children if c.proc is not None],
            "metrics_ports": [i.get("metrics_port") for i in infos if i is not None],
        }
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(ready_file)
