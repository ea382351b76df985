"""`splitserve operator run` argument handling (the run itself is covered by integration tests)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from click.testing import CliRunner

from splitserve.cli.operator import operator

KUBECONFIG_OK = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
"""A kubeconfig the client loads (the server is never called: kopf is replaced)."""


def test_needs_a_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPLITSERVE_NAMESPACE", raising=False)
    result = CliRunner().invoke(operator, ["run"])
    assert result.exit_code == 2
    assert "--namespace" in result.output


def _fake_kopf(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`kopf.operator` replaced by a recorder (the keyword arguments of its call), and the
    logging state `operator run` configures restored after the test."""
    import kopf

    seen: dict[str, Any] = {}

    async def fake_operator(**kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    root, aio = logging.getLogger(), logging.getLogger("asyncio")
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(aio, "propagate", aio.propagate)
    monkeypatch.setattr(aio, "handlers", list(aio.handlers))
    return seen


def test_configures_and_starts_kopf(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from splitserve.operator import handlers

    seen = _fake_kopf(monkeypatch)
    monkeypatch.setenv("SPLITSERVE_NAMESPACE", "ops")
    (tmp_path / "config").write_text(KUBECONFIG_OK)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    result = CliRunner().invoke(
        operator, ["run", "--interval", "2", "--router-image", "r:1", "--log-level", "WARNING"]
    )
    assert result.exit_code == 0, result.output
    assert seen["namespaces"] == ["ops"]
    assert seen["standalone"] is True
    op = seen["memo"]["operator"]
    assert isinstance(op, handlers.Operator)
    assert op.config.interval_s == 2
    assert op.config.settings.router_image == "r:1"
    timers = [h for h in seen["registry"]._spawning.get_all_handlers() if h.id == "tick"]
    assert [t.interval for t in timers] == [2]
    result = CliRunner().invoke(operator, ["run", "-A"])
    assert result.exit_code == 0, result.output
    assert seen["clusterwide"] is True


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_kubeconfig_that_does_not_exist_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, how: str
) -> None:
    """Found by the operations.md probe: a mistyped path started the operator, whose start-up
    then failed "Invalid kube-config file. No configuration found" every 60 s."""
    import kopf

    started: list[bool] = []

    async def fake_operator(**kwargs: Any) -> None:
        started.append(True)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    missing = str(tmp_path / "nope.yaml")
    args = ["run", "-n", "default"]
    if how == "flag":
        args += ["--kubeconfig", missing]
    else:
        monkeypatch.setenv("KUBECONFIG", f"{missing}:{tmp_path / 'other.yaml'}")
    result = CliRunner().invoke(operator, args)
    assert result.exit_code == 2, result.output
    assert "--kubeconfig" in result.output
    assert "nope.yaml" in result.output
    assert not started


def test_a_kubeconfig_list_with_one_existing_file_is_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    seen = _fake_kopf(monkeypatch)
    there = tmp_path / "config"
    there.write_text(KUBECONFIG_OK)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{there}")
    result = CliRunner().invoke(operator, ["run", "-n", "default", "--no-internal-tls"])
    assert result.exit_code == 0, result.output
    assert seen


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("garbage: [\n", "not YAML"),
        ("apiVersion: v1\nkind: Config\nclusters: []\n", "current-context"),
        ("- a\n- b\n", "not a kubeconfig"),
        (KUBECONFIG_OK.replace('server: "https://127.0.0.1:6443"', "insecure: true"), "server"),
    ],
    ids=["not-yaml", "no-context", "a-list", "no-server"],
)
def test_a_kubeconfig_that_cannot_be_used_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, text: str, says: str
) -> None:
    """Found by the operator probe: `operator run --kubeconfig bad.yaml` started kopf, whose
    start-up then logged a chained traceback (yaml.parser.ParserError, TypeError, ...) and
    retried every 60 s; with no server the operator started and called nowhere."""
    seen = _fake_kopf(monkeypatch)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(
        operator, ["run", "-n", "default", "--no-internal-tls", "--kubeconfig", str(path)]
    )
    assert result.exit_code == 1, result.output
    assert not seen  # kopf never started
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert line.startswith("Error: kubeconfig ")
    assert str(path) in line
    assert says in line


def test_no_credentials_at_all_is_one_line_saying_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Not in a pod and no ~/.kube/config: was kopf's start-up failing with two chained
    tracebacks ("Service host/port is not set", "No configuration found") every 60 s."""
    seen = _fake_kopf(monkeypatch)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(operator, ["run", "-n", "default", "--no-internal-tls"])
    assert result.exit_code == 1, result.output
    assert not seen
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert "no Kubernetes credentials" in line
    assert "~/.kube/config" in line
    assert "--kubeconfig" in line


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, *args: str) -> tuple[Any, dict[str, Any]]:
    """`operator run ARGS` with a loadable kubeconfig and kopf replaced by a recorder."""
    seen = _fake_kopf(monkeypatch)
    config = tmp_path / "config"
    config.write_text(KUBECONFIG_OK)
    argv = ["run", "--no-internal-tls", "--kubeconfig", str(config), *args]
    return CliRunner().invoke(operator, argv), seen


def test_all_namespaces_beside_a_namespace_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Was kopf's `TypeError: The operator can be either cluster-wide or namespaced, not
    both.` with a traceback."""
    result, seen = _run(monkeypatch, tmp_path, "-A", "-n", "ml")
    assert result.exit_code == 2, result.output
    assert "--all-namespaces" in result.output
    assert "--namespace" in result.output
    assert "Traceback" not in result.output
    assert not seen


@pytest.mark.parametrize("namespace", ["Bad_NS", "ml-*", "-x", "a" * 64])
def test_a_namespace_that_is_not_a_namespace_name_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, namespace: str
) -> None:
    """Was accepted: kopf watched a namespace that cannot exist (or a kopf glob the chart never
    passes, whose first entry then named the internal CA's namespace), and served nothing."""
    result, seen = _run(monkeypatch, tmp_path, "-n", "ml", "-n", namespace)
    assert result.exit_code == 2, result.output
    assert "--namespace" in result.output
    assert repr(namespace) in result.output
    assert not seen


@pytest.mark.parametrize(
    "url", ["notaurl", "https://0.0.0.0:8080/healthz", "http://0.0.0.0:99999/healthz"]
)
def test_a_liveness_url_kopf_cannot_serve_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, url: str
) -> None:
    """Was accepted: kopf's health reporter then failed with a traceback ("Unsupported scheme",
    "Port out of range") after start-up, and the operator ran on without its liveness
    endpoint (or exited 1), so the kubelet's probe would restart it for ever."""
    result, seen = _run(monkeypatch, tmp_path, "-n", "ml", "--liveness", url)
    assert result.exit_code == 2, result.output
    assert "--liveness" in result.output
    assert "Traceback" not in result.output
    assert not seen


@pytest.mark.parametrize("flag", ["--liveness", "--metrics-port"])
def test_a_port_in_use_is_one_line_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, flag: str
) -> None:
    """Was `OSError: [Errno 98] Address already in use` with a traceback (--metrics-port), or
    a failed health reporter the operator ran on without (--liveness)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        value = f"http://127.0.0.1:{port}/healthz" if flag == "--liveness" else str(port)
        if flag == "--metrics-port":
            from splitserve.operator.control import runtime

            monkeypatch.setattr(runtime, "serve", _serve_on_loopback(runtime.serve))
        result, seen = _run(monkeypatch, tmp_path, "-n", "ml", flag, value)
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "in use" in result.output
    assert "Traceback" not in result.output
    assert not seen


def _serve_on_loopback(serve: Any) -> Any:
    """`runtime.serve` on 127.0.0.1 (the CLI binds 0.0.0.0; the test's busy socket is on the
    loopback address, where a bind on 0.0.0.0 may still succeed on some systems)."""

    def on_loopback(host: str, port: int) -> Any:
        return serve("127.0.0.1", port)

    return on_loopback
