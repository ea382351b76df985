"""Typed models of splitserve's APIs: the Kubernetes custom resources and the chart's values.

The pydantic models here are the single source of truth. The CRD schemas, the Helm chart's
`values.schema.json` and `docs/crd-reference.md` are generated from them (`splitserve gen crds`).
"""
