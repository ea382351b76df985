"""`splitserve operator run`: the Kubernetes operator (kopf, embedded)."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TextIO

import click

from splitserve.cli.numbers import FiniteFloat
from splitserve.cli.tls_option import tls_option


def _image(value: str) -> str:
    """An image reference for `--router-image`: not empty, no whitespace (the router
    Deployment's container would be refused by the API server or the kubelet)."""
    if not re.fullmatch(r"\S+", value):
        raise click.BadParameter(f"{value!r} is not an image reference (empty or whitespace)")
    return value


@click.group()
def operator() -> None:
    """The Kubernetes operator for LLMService and LLMPool."""


@operator.command()
@tls_option
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    help="Watch this namespace (repeatable). Default: the operator's own (SPLITSERVE_NAMESPACE).",
)
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace.")
@click.option(
    "--internal-tls/--no-internal-tls",
    envvar="SPLITSERVE_INTERNAL_TLS",
    default=True,
    show_default=True,
    help="Issue each service's internal TLS certificates from a CA kept in the Secret "
    "splitserve-internal-ca of the operator's namespace (SPLITSERVE_NAMESPACE) and mount them: "
    "router, worker and operator RPCs use mutual TLS. Off: plaintext, or your own --tls-dir.",
)
@click.option(
    "--cert-manager-issuer",
    envvar="SPLITSERVE_CERT_MANAGER_ISSUER",
    default="",
    metavar="[ClusterIssuer/|Issuer/]NAME",
    help="With --internal-tls: render cert-manager Certificates issued by this (CA) issuer "
    "instead of issuing from the operator's own CA; the operator's own certificate then comes "
    "from --tls-dir. Refused at start when cert-manager's CRDs are not installed.",
)
@click.option(
    "--router-image",
    envvar="SPLITSERVE_ROUTER_IMAGE",
    default="ghcr.io/splitserve/splitserve:latest",
    show_default=True,
    callback=lambda ctx, param, value: _image(value),
    help="Router image for LLMServices that name none.",
)
@click.option(
    "--interval",
    type=FiniteFloat(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds between reconciles of each service when nothing changes.",
)
@click.option(
    "--drain-wait",
    type=FiniteFloat(min=0),
    default=2.0,
    show_default=True,
    help="Seconds one Drain call may block before the flip resumes on the next tick.",
)
@click.option(
    "--liveness",
    default=None,
    metavar="URL",
    help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="SPLITSERVE_OPERATOR_METRICS_PORT",
    default=0,
    show_default=True,
    help="Serve the control loop's /metrics and /healthz on this port (0: off; the chart "
    "sets 8081).",
)
@click.option(
    "--kubeconfig",
    envvar="KUBECONFIG",
    default=None,
    help="Identity of every call the operator makes, kopf's own included. "
    "Default: the pod's ServiceAccount, else ~/.kube/config.",
)
@click.option(
    "--log-level",
    envvar="SPLITSERVE_LOG_LEVEL",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
def run(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    internal_tls: bool,
    cert_manager_issuer: str,
    router_image: str,
    interval: float,
    drain_wait: float,
    liveness: str | None,
    metrics_port: int,
    kubeconfig: str | None,
    log_level: str,
) -> None:
    """Run the operator until interrupted."""
    import os

    import kopf

    from splitserve.operator import handlers
    from splitserve.operator.reconcile import Settings

    own = os.environ.get("SPLITSERVE_NAMESPACE")
    if namespaces and all_namespaces:
        raise click.UsageError("give --namespace (repeatable) or --all-namespaces, not both")
    for ns in namespaces:
        if len(ns) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", ns):
            raise click.BadParameter(
                f"{ns!r} is not a namespace name (lower-case letters, digits and '-', at most 63)",
                param_hint="--namespace",
            )
    if liveness is not None:
        _check_liveness(liveness)
    if not namespaces and not all_namespaces:
        if not own:
            raise click.UsageError("give --namespace (repeatable) or --all-namespaces")
        namespaces = (own,)
    if kubeconfig:
        # The Kubernetes client merges a list (as kubectl does) and skips missing files; with
        # none there, start-up would fail "No configuration found" and retry every 60 s.
        paths = [p for p in kubeconfig.split(os.pathsep) if p]
        if not any(os.path.isfile(os.path.expanduser(p)) for p in paths):
            raise click.BadParameter(
                f"no such file: {kubeconfig} (from --kubeconfig or $KUBECONFIG)",
                param_hint="--kubeconfig",
            )
    ca_namespace = None
    issuer = None
    if cert_manager_issuer:
        from splitserve.operator.certs import IssuerRef

        if not internal_tls:
            raise click.UsageError("--cert-manager-issuer needs --internal-tls")
        try:
            issuer = IssuerRef.parse(cert_manager_issuer)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--cert-manager-issuer") from None
    if internal_tls:
        from splitserve.security import tls

        if issuer is not None and tls.identity() is None:
            raise click.UsageError(
                "--cert-manager-issuer: the operator's own certificate comes from --tls-dir "
                "(SPLITSERVE_TLS_DIR; the chart mounts a cert-manager Certificate there)"
            )
        if issuer is None and tls.identity() is not None:
            raise click.UsageError(
                "--tls-dir and --internal-tls: give --no-internal-tls to use your own certificate"
            )
        ca_namespace = own or (namespaces[0] if namespaces else None)
        if ca_namespace is None:
            raise click.UsageError(
                "--internal-tls keeps its CA in the operator's namespace: set SPLITSERVE_NAMESPACE"
            )
    from splitserve.operator.kube import KubeconfigError, load_configuration

    try:  # after the usage checks, once: kopf's start-up would log a traceback every 60 s
        load_configuration(kubeconfig)
    except KubeconfigError as err:
        raise click.ClickException(str(err)) from None
    kopf.configure(debug=log_level == "DEBUG", verbose=log_level in ("DEBUG", "INFO"))
    logging.getLogger().setLevel(log_level)
    config = handlers.OperatorConfig(
        settings=Settings(router_image=router_image, drain_wait_s=drain_wait),
        interval_s=interval,
        kubeconfig=kubeconfig,
        internal_tls_namespace=ca_namespace,
        cert_manager_issuer=issuer,
    )
    if metrics_port:
        from splitserve.operator.control import runtime

        runtime.startup().begin()  # /healthz: 503 until kopf's start-up succeeded
        try:
            runtime.serve("0.0.0.0", metrics_port)
        except OSError as err:
            raise click.BadParameter(
                f"{metrics_port}: {err.strerror or err}", param_hint="--metrics-port"
            ) from None
    asyncio.run(
        kopf.operator(
            registry=handlers.registry(config),
            memo=handlers.memo(config),
            standalone=True,
            clusterwide=all_namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
        )
    )


def _check_liveness(url: str) -> None:
    """Refuse a `--liveness` URL kopf's health reporter cannot serve: it would fail after
    start-up (a traceback) and the operator run on without it, restarted by the kubelet's
    probe for ever."""
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError as err:
        raise click.BadParameter(f"{url}: {err}", param_hint="--liveness") from None
    if parts.scheme != "http" or not parts.hostname:
        raise click.BadParameter(
            f"{url}: an http:// URL with a host, e.g. http://0.0.0.0:8080/healthz",
            param_hint="--liveness",
        )
    try:  # as kopf's server binds it (SO_REUSEADDR): a port another process listens on fails
        with socket.socket(socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((parts.hostname, port))
    except OSError as err:
        raise click.BadParameter(f"{url}: {err.strerror or err}", param_hint="--liveness") from None


@operator.command("render")
@click.option(
    "-f",
    "--filename",
    "source",
    type=click.File("r"),
    required=True,
    help="YAML file with LLMService documents ('-' reads stdin).",
)
@click.option(
    "--namespace", "-n", default=None, help="For services whose metadata names none (default)."
)
@click.option(
    "--router-image",
    envvar="SPLITSERVE_ROUTER_IMAGE",
    default="ghcr.io/splitserve/splitserve:latest",
    show_default=True,
    callback=lambda ctx, param, value: _image(value),
    help="Router image for LLMServices that name none (as the operator's --router-image).",
)
def render_cmd(source: TextIO, namespace: str | None, router_image: str) -> None:
    """Print every object the operator would create for the LLMServices in a file (dry run)."""
    import yaml
    from pydantic import ValidationError

    from splitserve.api.v1alpha1 import API_VERSION
    from splitserve.api.validation import utf8_problem, yaml_problem
    from splitserve.operator.render import dump_manifests, render_documents
    from splitserve.operator.validate import spec_errors

    try:
        docs = list(yaml.safe_load_all(source.read()))
        manifests, notes = render_documents(docs, namespace, router_image)
    except UnicodeDecodeError as err:
        raise click.ClickException(f"{source.name}: {utf8_problem(err)}") from None
    except yaml.YAMLError as err:
        raise click.ClickException(f"{source.name}: {yaml_problem(err)}") from None
    except ValidationError as err:
        lines = [f"  {line}" for line in spec_errors(err)]
        raise click.ClickException(
            f"{source.name}: invalid LLMService:\n" + "\n".join(lines)
        ) from None
    except ValueError as err:
        raise click.ClickException(f"{source.name}: {err}") from None
    for note in notes:
        click.echo(note, err=True)
    if not manifests:  # printed nothing, exit 0 (a typo in kind: only the note above)
        raise click.ClickException(
            f"{source.name}: no LLMService (apiVersion {API_VERSION}) in the file"
        )
    click.echo(dump_manifests(manifests), nl=False)
