"""Security edges shared by the router, the worker and the operator: gRPC method guards
(interceptors that check a caller before a method runs), the local certificate authority and the
TLS credentials of internal RPCs (docs/security.md).
"""
