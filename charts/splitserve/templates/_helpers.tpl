{{/* Names and labels shared by every template. */}}

{{- define "splitserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "splitserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* app.kubernetes.io/name is always splitserve, whatever nameOverride: the workers'
     NetworkPolicy admits the operator by it (LLMService networkPolicy.operatorLabels), and the
     PodMonitor selects the operator and the workers by it. */}}
{{- define "splitserve.selectorLabels" -}}
app.kubernetes.io/name: splitserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "splitserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "splitserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: splitserve
{{- end -}}

{{- define "splitserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "splitserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "splitserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces the operator watches (when not cluster-wide). */}}
{{- define "splitserve.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped reads kopf needs even when it serves only some namespaces. */}}
{{- define "splitserve.discoveryRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* The rules the operator needs where it manages LLMServices (a Role, or the ClusterRole).
     Exactly what it uses: tests/unit/operator/test_operator_rbac.py derives the rules from the
     operator's API calls and compares. */}}
{{- define "splitserve.managerRules" -}}
# The custom resources: kopf watches services and patches their finalizer and annotations; the
# operator creates, merge-patches and prunes pools; every object it reads is watched (a cache),
# and read directly only when a create conflicts.
- apiGroups: ["splitserve.io"]
  resources: ["llmservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["splitserve.io"]
  resources: ["llmpools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["splitserve.io"]
  resources: ["llmservices/status", "llmpools/status"]
  verbs: ["patch"]
# Children point at their LLMService with blockOwnerDeletion: the
# OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift) requires this.
- apiGroups: ["splitserve.io"]
  resources: ["llmservices/finalizers"]
  verbs: ["update"]
# What an LLMService owns.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Each service's NetworkPolicies (workers reachable only from its router, its workers and the
# operator; docs/security.md).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The model cache (model.cache): its claim and download Jobs.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Worker pods: role and fence labels, flip progress and deletion-cost annotations. get is
# granted by the router's Role, which the operator creates (RBAC lets nobody grant what they
# do not hold).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# Events on LLMServices (decisions, flip steps, failures); a repeat bumps its count.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* Internal TLS (operator --internal-tls, on by default): each service's router and worker
certificates, in every watched namespace. */}}
{{- define "splitserve.internalTlsRules" -}}
# The operator's own CA issues them: kubernetes.io/tls Secrets it owns (and, in the operator's
# own namespace, the CA, splitserve-internal-ca). Read live, never listed or watched.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
{{- end -}}

{{- define "splitserve.certManagerRules" -}}
# cert-manager issues them (operator.certManager): Certificates the service owns; cert-manager
# writes their Secrets, which only the pods mount. When the service goes, the operator deletes
# its Certificates, then their Secrets (cert-manager sets no ownerReference on them by default),
# never reading a Secret.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["delete"]
{{- end -}}

{{- define "splitserve.tlsRules" -}}
{{- if not .Values.operator.internalTls }}
{{- else if .Values.operator.certManager.enabled }}
{{ include "splitserve.certManagerRules" . }}
{{- else }}
{{ include "splitserve.internalTlsRules" . }}
{{- end }}
{{- end -}}

{{/* Values that contradict each other (ChartValues refuses the same): fail naming them rather
     than render one of them unused, or an operator that cannot start. */}}
{{- define "splitserve.checkValues" -}}
{{- $op := .Values.operator -}}
{{- if and $op.allNamespaces $op.watchNamespaces -}}
{{- fail "operator.watchNamespaces is unused with operator.allNamespaces: true (every namespace is watched); set one of them" -}}
{{- end -}}
{{- if and $op.certManager.enabled (not $op.internalTls) -}}
{{- fail "operator.certManager.enabled needs operator.internalTls: true (cert-manager issues the internal TLS certificates); set internalTls or turn certManager off" -}}
{{- end -}}
{{- if and (not $op.certManager.enabled) (or $op.certManager.issuerRef.name (ne $op.certManager.issuerRef.kind "ClusterIssuer")) -}}
{{- fail "operator.certManager.issuerRef is read only with operator.certManager.enabled: true (the operator's own CA issues the certificates otherwise); enable it or remove it" -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.name is needed with serviceAccount.create: false (the account you bring); left empty, the operator's roles would be bound to the namespace's default ServiceAccount, which every pod there runs as" -}}
{{- end -}}
{{- if eq (int $op.metricsPort) (int .Values.monitoring.operatorMetricsPort) -}}
{{- fail (printf "operator.metricsPort and monitoring.operatorMetricsPort are both %d: the liveness endpoint and /metrics need a port each" (int $op.metricsPort)) -}}
{{- end -}}
{{- end -}}
