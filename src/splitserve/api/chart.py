"""Values of the `charts/splitserve` Helm chart; `values.schema.json` is generated from these."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field, field_validator, model_validator

from splitserve.api.v1alpha1 import Model, PullPolicy, ResourceRequirements

NAMESPACE: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A namespace name (an RFC 1123 label)."""

NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=NAMESPACE)]


class ImageValues(Model):
    repository: str = Field("ghcr.io/splitserve/splitserve", min_length=1)
    """Image of the operator (and, by default, of the routers it creates)."""
    tag: str = ""
    """Image tag. Empty: the chart's appVersion."""
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    """Kubernetes image pull policy."""


class LocalObjectReference(Model):
    name: str = Field(min_length=1)
    """Name of the Secret."""


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class IssuerKind(StrEnum):
    ISSUER = "Issuer"
    CLUSTER_ISSUER = "ClusterIssuer"


class IssuerRefValues(Model):
    name: str = Field("", max_length=253)
    """Name of the cert-manager issuer. A CA issuer: every service's certificates and the
    operator's must chain to the one CA the `ca.crt` of each Secret names."""
    kind: IssuerKind = IssuerKind.CLUSTER_ISSUER
    """ClusterIssuer (one for every namespace), or Issuer (then one of that name in the release
    namespace and in every watched namespace)."""


class CertManagerValues(Model):
    enabled: bool = False
    """Have cert-manager issue the internal certificates (with `internalTls`): the operator
    renders a `Certificate` per service and role instead of issuing from its own CA, and the
    chart renders the operator's own. The operator refuses to start when cert-manager's CRDs
    are not installed."""
    issuer_ref: IssuerRefValues = Field(default_factory=IssuerRefValues)
    """The issuer of every internal certificate (required when enabled)."""


class OperatorValues(Model):
    replicas: int = Field(1, ge=0, le=1)
    """Operator pods. One: the operator runs standalone (no peering), so it must not run twice."""
    log_level: LogLevel = LogLevel.INFO
    """Log level of the operator."""
    watch_namespaces: list[NamespaceName] = Field(
        default_factory=list, json_schema_extra={"uniqueItems": True}
    )
    """Namespaces to watch for LLMServices (distinct namespace names). Empty: the release
    namespace only."""
    all_namespaces: bool = False
    """Watch every namespace (cluster-wide RBAC instead of per-namespace Roles)."""
    router_image: str = Field("", max_length=1024, pattern=r"^(\S+)?$")
    """Default router image for LLMServices that name none. Empty: the operator's image."""
    internal_tls: bool = True
    """Issue and mount internal TLS certificates for every LLMService (CA in the Secret
    `splitserve-internal-ca` of the release namespace; docs/security.md). false: internal RPCs
    are plaintext (`operator run --no-internal-tls`)."""
    cert_manager: CertManagerValues = Field(default_factory=CertManagerValues)
    """Internal certificates from cert-manager instead of the operator's CA (docs/security.md)."""
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(
            requests={"cpu": "100m", "memory": "128Mi"}, limits={"memory": "512Mi"}
        )
    )
    """Resources of the operator container."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the operator pod must run on."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations of the operator pod."""
    metrics_port: int = Field(8080, ge=1, le=65535)
    """Port of the operator's liveness endpoint (`/healthz`)."""

    @field_validator("watch_namespaces")
    @classmethod
    def _distinct(cls, namespaces: list[str]) -> list[str]:
        repeated = sorted({ns for ns in namespaces if namespaces.count(ns) > 1})
        if repeated:
            raise ValueError(f"names a namespace more than once: {', '.join(repeated)}")
        return namespaces

    @model_validator(mode="after")
    def _consistent(self) -> OperatorValues:
        if self.all_namespaces and self.watch_namespaces:
            raise ValueError(
                "watchNamespaces is unused with allNamespaces: true (every namespace is "
                "watched); set one of them"
            )
        issuer = self.cert_manager.issuer_ref
        if not self.cert_manager.enabled and (
            issuer.name or issuer.kind is not IssuerKind.CLUSTER_ISSUER
        ):
            raise ValueError(
                "certManager.issuerRef is read only with certManager.enabled: true (the "
                "operator's own CA issues the certificates otherwise); enable it or remove it"
            )
        if self.cert_manager.enabled and not self.internal_tls:
            raise ValueError(
                "certManager.enabled needs internalTls: true (cert-manager issues the internal "
                "TLS certificates)"
            )
        return self


class ServiceAccountValues(Model):
    create: bool = True
    """Create the operator's ServiceAccount."""
    name: str = Field("", max_length=253, pattern=r"^([a-z0-9]([-.a-z0-9]*[a-z0-9])?)?$")
    """ServiceAccount name. Empty: the release's full name."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the ServiceAccount (e.g. workload identity)."""

    @model_validator(mode="after")
    def _named_when_brought(self) -> ServiceAccountValues:
        if not self.create and not self.name:
            raise ValueError(
                "serviceAccount.name is needed with serviceAccount.create: false (the account "
                "you bring); left empty, the operator's roles would be bound to the namespace's "
                "default ServiceAccount, which every pod there runs as"
            )
        return self


class RbacValues(Model):
    create: bool = True
    """Create the least-privilege (Cluster)Roles and bindings the operator needs."""


class MonitorValues(Model):
    enabled: bool = False
    """Create it (needs the Prometheus Operator's CRDs)."""
    interval: str = Field("15s", pattern=r"^[0-9]+(ms|s|m)$")
    """Scrape interval."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels, e.g. the `release` label your Prometheus selects monitors by."""


class DashboardsValues(Model):
    enabled: bool = False
    """Ship the Grafana dashboards as ConfigMaps (one per dashboard)."""
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    """Labels Grafana's dashboard sidecar looks for."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations, e.g. the sidecar's target folder."""


class MonitoringValues(Model):
    operator_metrics_port: int = Field(8081, ge=1, le=65535)
    """Port of the operator's `/metrics` (the control loop's `splitserve_operator_*` series)."""
    scrape_annotations: bool = True
    """Annotate the operator pod with `prometheus.io/scrape`, `port` and `path`."""
    pod_monitor: MonitorValues = Field(default_factory=MonitorValues)
    """A PodMonitor for the operator and the workers (port `metrics`) of watched namespaces."""
    service_monitor: MonitorValues = Field(default_factory=MonitorValues)
    """A ServiceMonitor for the routers' Services (port `http`, `/metrics`)."""
    dashboards: DashboardsValues = Field(default_factory=DashboardsValues)
    """The Grafana dashboards (`deploy/grafana/`), for Grafana's sidecar."""


class ChartValues(Model):
    """Values of the splitserve chart (`helm install splitserve charts/splitserve -f ...`)."""

    image: ImageValues = Field(default_factory=ImageValues)
    """The splitserve image."""
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list)
    """Secrets for pulling the image from a private registry."""
    name_override: str = ""
    """Replaces the chart name in object names."""
    full_name_override: str = Field("", alias="fullnameOverride")
    """Replaces the release-and-chart full name in object names."""
    operator: OperatorValues = Field(default_factory=OperatorValues)
    """The operator Deployment."""
    service_account: ServiceAccountValues = Field(default_factory=ServiceAccountValues)
    """The operator's ServiceAccount."""
    rbac: RbacValues = Field(default_factory=RbacValues)
    """RBAC objects."""
    monitoring: MonitoringValues = Field(default_factory=MonitoringValues)
    """Prometheus scraping and Grafana dashboards."""

    @model_validator(mode="after")
    def _ports(self) -> ChartValues:
        if self.operator.metrics_port == self.monitoring.operator_metrics_port:
            raise ValueError(
                f"operator.metricsPort and monitoring.operatorMetricsPort are both "
                f"{self.operator.metrics_port}: the liveness endpoint and /metrics need a port each"
            )
        return self
