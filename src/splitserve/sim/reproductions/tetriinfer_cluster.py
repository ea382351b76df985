"""TetriInfer's cluster set-up for the simulator: prefill and decode instances with its policies.

Owns: `tetriinfer_spec` (a prefill pool running "tetriinfer-prefill", a decode pool running
"tetriinfer-decode", prefill routing by least load, decode selection by the "tetriinfer-p2c"
scorer), `RoutedMix` (the heavy/light decode counts that scorer reads), `PaddedPrefillModel`
(the paper's prefill instance's step cost: zero-padded chunks, the length predictor beside the
main model), `emulated_link` (the paper's mock KV link) and `simulate_tetriinfer`, which
runs a workload on such a cluster. Built only on the simulator's public API (`Cluster`,
`Simulator`); nothing in `cluster.py` changes.

Departure from the paper, noted: the decode instance is chosen when the request arrives (the
live router's model, research C-table "Decode selection"), not by the prefill instance's
dispatcher once the first chunk is prefilled; the heavy/light counts are the router's own
(requests sent to a decode instance and not yet finished), so they are never stale, where the
paper's come from a 100 ms broadcast.

Pure: no I/O, no wall time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitserve.core.ids import EndpointId, PoolName
from splitserve.core.perf import BatchShape, LatencyModel
from splitserve.core.perf.catalog import LinkedModel
from splitserve.core.perf.kvlink import LinearLink
from splitserve.core.roles import Role
from splitserve.policy.placement.base import RequestView
from splitserve.policy.placement.decider import PdDeciderParams
from splitserve.policy.placement.profile import PluginSpec, ProfileSpec, default_prefill_profile
from splitserve.policy.placement.tetriinfer import HeavyLightMix, predicted_output_tokens
from splitserve.sim.cluster import Cluster, ClusterSpec
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, SimRequest, WorkerTemplate
from splitserve.sim.metrics import SimResult
from splitserve.sim.workload import WorkItem

PREDICTOR_PREFILL_OVERHEAD = 0.10
"""§5.4 (Fig. 19's text): "while co-running with a small LLM, the large LLM's average prefill
latency increases by 10 %" (OPT-125M predictor beside OPT-13B; §3.3: "we concurrently execute
the prefill phase of the main LLM alongside the length predictor"). The paper calls it a stress
test whose impact "will be smaller in practice"; its own figure is used, not a chosen one."""


@dataclass(frozen=True, slots=True)
class PaddedPrefillModel:
    """TetriInfer's prefill instance as the paper runs it, priced on `base`.

    * §3.3: "The final chunk in a batch could be partial, and we will pad it to ChunkSize with
      zeros. Then, we invoke the main LLM model to execute prefill forward one chunk at a time."
      A prefill-only step with fewer than `chunk_tokens` new tokens is priced as if the missing
      tokens were one more prompt of zeros (no cached context). (The live policy does not pad:
      research B6.2; only the reproduction prices it.)
    * The length predictor running beside the main model: every prefill step costs
      (1 + `predictor_overhead`) × its time.
    """

    base: LatencyModel
    chunk_tokens: int = 512
    predictor_overhead: float = PREDICTOR_PREFILL_OVERHEAD

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or not self.predictor_overhead >= 0:
            raise ValueError("chunk_tokens must be >= 1 and predictor_overhead >= 0")

    @property
    def ready(self) -> bool:
        return self.base.ready

    def step_s(self, batch: BatchShape) -> float:
        if not batch.prefill_chunks:
            return self.base.step_s(batch)
        new = sum(n for n, _ in batch.prefill_chunks)
        if not batch.decode_contexts and new < self.chunk_tokens:
            batch = BatchShape((*batch.prefill_chunks, (self.chunk_tokens - new, 0)))
        return self.base.step_s(batch) * (1.0 + self.predictor_overhead)

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.base.kv_transfer_s(num_bytes)


TS_ROCE = LinearLink(latency_s=0.0, bandwidth_bytes_s=200e9 / 8)
"""§5.1's TS-RoCE set-up: prefill and decode instances "communicate over 200Gbps RoCE". The
paper does not move the KV at all (§4's mock): the decode instance holds it pre-loaded, receives
only the request's metadata, "calculates the latency of the KV cache transfer and waits
accordingly", the latency "calculated given a specific model architecture and the hardware
bandwidth we aim to emulate": bytes / bandwidth, no fixed cost. (TS-NVLink, 300 GB/s, is the
paper's other set-up; the LPLD row holds "for both", the others are not broken out by link.)"""


def emulated_link(base: LatencyModel) -> LinkedModel:
    """`base`'s step times with the KV transfer priced by the paper's emulated link (`TS_ROCE`).

    Needed because the latency models bring their own link: the roofline the V100 preset's
    (25 GB/s plus a fixed latency), DistServe's A100 fit carried to the V100 (`RescaledModel`)
    the A100 NVLink it was vendored with (Vidur's send/recv, ≈ 230 GB/s at these sizes), which
    is neither of the paper's emulated links."""
    return LinkedModel(base, TS_ROCE)


class RoutedMix:
    """Heavy/light decode counts per decode endpoint, from the requests a cluster routed there.

    Bound to a `Cluster` after it is built (`bind`); until then every endpoint reads as empty.
    A request counts from its arrival until it finishes or is dropped.
    """

    def __init__(self, heavy_threshold_tokens: int = 128, granularity_tokens: int = 200) -> None:
        self.heavy_threshold_tokens = heavy_threshold_tokens
        self.granularity_tokens = granularity_tokens
        self._cluster: Cluster | None = None
        self._open: list[SimRequest] = []
        self._seen = 0

    def bind(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._open = []
        self._seen = 0

    def is_heavy(self, req: SimRequest) -> bool:
        view = RequestView(req.id, req.item.num_prompt_tokens, req.item.num_output_tokens)
        predicted = predicted_output_tokens(view, self.granularity_tokens)
        return predicted >= self.heavy_threshold_tokens

    def __call__(self, eid: EndpointId) -> HeavyLightMix:
        cluster = self._cluster
        if cluster is None:
            return HeavyLightMix()
        self._open.extend(cluster.requests[self._seen :])
        self._seen = len(cluster.requests)
        self._open = [r for r in self._open if r.finish_s is None and not r.dropped]
        index = cluster.router.worker_index(eid)
        heavy = light = 0
        for r in self._open:
            if r.decode_worker == index:
                if self.is_heavy(r):
                    heavy += 1
                else:
                    light += 1
        return HeavyLightMix(heavy, light)


def tetriinfer_spec(
    prefill: WorkerTemplate,
    decode: WorkerTemplate,
    num_prefill: int = 1,
    num_decode: int = 1,
    mix: RoutedMix | None = None,
    seed: int = 0,
) -> ClusterSpec:
    """Prefill pool + decode pool with TetriInfer's placement; templates name their policies."""
    p2c: Mapping[str, Any] = {"seed": seed}
    if mix is not None:
        p2c = {
            "seed": seed,
            "mix_of": mix,
            "heavy_threshold_tokens": mix.heavy_threshold_tokens,
            "length_granularity_tokens": mix.granularity_tokens,
        }
    decode_profile = ProfileSpec(
        name="tetriinfer-decode",
        filters=(
            PluginSpec("accepts-work"),
            PluginSpec("role", params={"roles": frozenset({Role.DECODE})}),
        ),
        scorers=(PluginSpec("tetriinfer-p2c", 1.0, p2c),),
    )
    return ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, num_prefill, prefill),
            PoolSpec(PoolName("decode"), Role.DECODE, num_decode, decode),
        ),
        decode_profile=decode_profile,
        prefill_profile=default_prefill_profile(),
        decider=PdDeciderParams(min_prompt_tokens_for_pd=1),
    )


def simulate_tetriinfer(
    spec: ClusterSpec, items: Sequence[WorkItem], mix: RoutedMix | None = None
) -> SimResult:
    """Run `items` to completion on a fresh cluster, binding `mix` to it first."""
    sim = Simulator()
    cluster = Cluster(spec, items)
    if mix is not None:
        mix.bind(cluster)
    cluster.start(sim)
    sim.run(cluster)
    return cluster.result(sim)
