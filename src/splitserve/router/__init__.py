"""The router: OpenAI HTTP and gRPC faces, the worker pool view, and P/D dispatch.

An edge (C1): it turns requests and worker load reports into observations, asks
`splitserve.policy.placement` where to run, and carries the decision out over gRPC.
Entry point: `splitserve.router.server.serve(config)`.
"""
