"""The Kubernetes operator: kopf handlers (thin) over a pure `render` and a pure flip planner.

Modules: `render` (desired objects, pure), `status` (conditions, pure), `observe` (pods to
observations, pure), `kube` (get/list/create/merge-patch/delete), `workers` (Drain/SetRole over
gRPC), `reconcile` (one pass for one service), `handlers` (kopf), `validate` (offline CR
validation), `testing` (in-memory fakes).
"""
