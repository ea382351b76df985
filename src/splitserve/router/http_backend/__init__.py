"""Stock `vllm serve` OpenAI servers as router workers (issue 18, docs/engines.md).

`HttpWorker` speaks vLLM's OpenAI HTTP API and its `kv_transfer_params` P/D protocol behind the
call shapes of the Worker service, so a server joins the pool (`PoolView.add_stub`) and gets the
same SLO placement, admission, fallbacks and OpenAI response path as a splitserve worker.
"""

from splitserve.router.http_backend.worker import HttpWorker

__all__ = ["HttpWorker"]
