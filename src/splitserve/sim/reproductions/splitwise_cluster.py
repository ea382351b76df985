"""Splitwise's cluster set-ups for the simulator: prompt, token and mixed pools on DGX machines.

Owns: the performance model Splitwise's simulator uses (`SplitwisePerf`: piece-wise linear
prompt and token curves per machine type, research/seed-splitwise-tetriinfer.md A4), the machine
types of its designs with their cost and provisioned power (`MACHINES`: DGX-A100, DGX-H100 and the
power-capped DGX-H100 of Splitwise-HHcap; Table I, Table V), the router-side pool ledger
(`PoolLedger`: which machines are borrowed into the mixed pool, the KV each has reserved), the
cluster specs (`splitwise_spec` for Splitwise-AA/HH/HA/HHcap, `baseline_spec` for Baseline-A100/
H100) and `simulate_splitwise`, which runs a workload on such a cluster. Built on the
simulator's public API (`Cluster`, `Simulator`), overriding the cluster's transfer-time hook
(`SplitwiseCluster.transfer_s`: Splitwise's transfer-mode rule).

How the paper maps onto the simulator:
* One machine = one worker (a DGX, 8 GPUs, TP 8, BLOOM-176B).
* Prompt machines are the PREFILL pool, token machines the DECODE pool; the mixed pool is
  dynamic, kept by `PoolLedger` from the requests the cluster routed (a machine is in it while it
  holds work of the opposite kind, the paper's rule; SplitwiseSim waits for full idleness).
* Placement: `splitwise-pool` filter + `splitwise-overflow` scorer per phase (JSQ on pending
  prompt tokens for prompts, on reserved KV for tokens; overflow own → mixed → opposite pool),
  and `SplitwiseDecider` (prompt machine = token machine: the request runs there whole).
* Every machine runs the same machine-level scheduler (`MLS_PARAMS`: FCFS, whole prompts up to
  2048 batched tokens run first, decodes batch up to 512 sequences), as the paper's baselines and
  mixed-pool machines do; a pure prompt or token machine never has the other kind of work.
* KV moves over the token machine's link (200 GB/s DGX-A100, 400 GB/s DGX-H100): layer-wise,
  overlapped with the prompt, for prompts of 512 tokens or more, serialized below
  (`KvOverlap.LAYER`, `SplitwiseCluster`); `KvOverlap.NONE` serializes every transfer.

Departures, noted: a step with prompts runs prompts only (the decodes wait one step, as when the
mixed MLS preempts them), where SplitwiseSim lets decodes ride along at 1.1× the prompt time; there
is no aging or per-request preemption cap, so a steady stream of prompts can hold decodes back for
several steps (past the SLO-compliant loads the reproduction searches). No coarse-grained
re-purposing of home pools.
Pure: no I/O, no wall time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from splitserve.core.ids import EndpointId, PoolName
from splitserve.core.kv import KvLayout, blocks_for
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.table import ProfileCurve
from splitserve.core.roles import Role
from splitserve.policy.placement.decider import PdDeciderParams
from splitserve.policy.placement.profile import (
    PluginSpec,
    ProfileSpec,
    build_profile,
    default_prefill_profile,
)
from splitserve.policy.placement.splitwise import SplitwiseDecider
from splitserve.sim.cluster import Cluster, ClusterSpec, KvOverlap
from splitserve.sim.engine import Simulator
from splitserve.sim.entities import PoolSpec, SimRequest, SimWorker, WorkerTemplate
from splitserve.sim.metrics import SimResult
from splitserve.sim.workload import WorkItem

# -- performance model --------------------------------------------------------------------------

PROMPT_TOKENS = (128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
TOKEN_BATCH = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
BLOOM_A100_PROMPT_MS = (79.7, 99.2, 173.8, 289.2, 540.4, 1348.0, 3593.0)
BLOOM_H100_PROMPT_MS = (48.3, 51.2, 75.5, 132.6, 253.1, 689.0, 1535.0)
BLOOM_A100_TOKEN_MS = (48.8, 50.0, 51.0, 53.0, 57.3, 65.4, 96.6)
BLOOM_H100_TOKEN_MS = (36.1, 36.9, 38.1, 38.1, 40.6, 45.8, 63.8)
"""BLOOM-176B, TP 8, medians from SplitwiseSim's `data/perf_model.csv` (research A4): prefill
time by prompt tokens (batch 1) and decode iteration time by batch size (prompt 512)."""

MIXED_FACTOR = 1.1
"""SplitwiseSim prices a batch mixing prompts and decodes at the prompt curve × 1.1."""
POWER_CAP_PROMPT_FACTOR = 1.3
"""A power-capped DGX-H100 runs prompts ≈ 1.3× slower, tokens unchanged (SplitwiseSim)."""

BLOOM_176B_KV = KvLayout(num_layers=70, num_kv_heads=112, head_dim=128)
"""BLOOM-176B (MHA, hidden 14336 = 112 × 128, fp16): 4.01 MB of KV per token."""
BLOOM_176B_WEIGHT_BYTES = 352e9


def _curve(xs: Sequence[float], ms: Sequence[float], scale: float = 1.0) -> ProfileCurve:
    return ProfileCurve(tuple(xs), tuple(m * scale / 1000.0 for m in ms))


@dataclass(frozen=True, slots=True)
class SplitwisePerf:
    """SplitwiseSim's piece-wise linear model: a batch of `x` = Σ prompt tokens + #decodes.

    All-decode batches cost `token(batch size)`; batches with prompt tokens cost `prompt(x)`,
    × `MIXED_FACTOR` when decodes ride along. A chunk after the first adds the prompt time its
    context makes it cost beyond a fresh prompt of its size (so chunking is free, not cheaper).
    """

    prompt: ProfileCurve
    token: ProfileCurve
    kv_link_bw_bytes_s: float = 200e9
    """Into this machine: 8 GPU pairs × 25 GB/s (DGX-A100) or × 50 GB/s (DGX-H100)."""
    kv_link_latency_s: float = 0.0005
    kv_layer_sync_s: float = 0.008
    """What a layer-wise transfer into this machine leaves visible beyond the last layer's share:
    the per-layer synchronisation the paper measured as a constant ≈ 8 ms (A100) / 5 ms (H100)."""

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        if batch.is_empty:
            return 0.0
        decodes = len(batch.decode_contexts)
        if not batch.prefill_chunks:
            return self.token.at(decodes)
        at = self.prompt.at
        x = decodes
        extra = 0.0
        for n, ctx in batch.prefill_chunks:
            x += n
            if ctx > 0:
                extra += max(0.0, at(ctx + n) - at(ctx) - at(n))
        t = at(x) + extra
        return t * MIXED_FACTOR if decodes else t

    def kv_transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.kv_link_latency_s + num_bytes / self.kv_link_bw_bytes_s


@dataclass(frozen=True, slots=True)
class MachineType:
    """One DGX machine type of the Splitwise designs."""

    name: str
    perf: SplitwisePerf
    cost_per_hour: float
    """Table I: $17.6/h DGX-A100, $38/h DGX-H100 (the 2.16× ratio SplitwiseSim uses)."""
    power: float
    """Provisioned power in DGX-A100 units (Table V: H100 1.75×, capped H100 1.23×)."""
    memory_bytes: float = 8 * 80e9

    def template(self, memory_utilization: float = 0.9) -> WorkerTemplate:
        kv_bytes = self.memory_bytes * memory_utilization - BLOOM_176B_WEIGHT_BYTES
        tokens = int(kv_bytes // BLOOM_176B_KV.bytes_per_token)
        return WorkerTemplate(
            latency=self.perf,
            num_blocks=tokens // 16,
            kv_layout=BLOOM_176B_KV,
            num_gpus=8,
            policy="fcfs",
            policy_params=dict(MLS_PARAMS),
        )


MLS_PARAMS: Mapping[str, object] = {
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 512,
    "chunked_prefill": False,
    "prefill_priority": True,
}
"""The machine-level scheduler on every machine: whole prompts FCFS up to 2048 batched tokens (a
longer prompt runs alone), run as soon as they fit, ahead of the decodes (the mixed MLS's prompt
priority: decodes wait out the prompt step); decodes batch up to 512 sequences and memory."""

A100 = MachineType(
    "dgx-a100",
    SplitwisePerf(
        _curve(PROMPT_TOKENS, BLOOM_A100_PROMPT_MS), _curve(TOKEN_BATCH, BLOOM_A100_TOKEN_MS)
    ),
    17.6,
    1.0,
)
H100 = MachineType(
    "dgx-h100",
    SplitwisePerf(
        _curve(PROMPT_TOKENS, BLOOM_H100_PROMPT_MS),
        _curve(TOKEN_BATCH, BLOOM_H100_TOKEN_MS),
        kv_link_bw_bytes_s=400e9,
        kv_layer_sync_s=0.005,
    ),
    38.0,
    1.75,
)
H100_CAP = MachineType(
    "dgx-h100-pcap",
    SplitwisePerf(
        _curve(PROMPT_TOKENS, BLOOM_H100_PROMPT_MS, POWER_CAP_PROMPT_FACTOR),
        _curve(TOKEN_BATCH, BLOOM_H100_TOKEN_MS),
        kv_link_bw_bytes_s=400e9,
        kv_layer_sync_s=0.005,
    ),
    38.0,
    1.23,
)
MACHINES = {m.name: m for m in (A100, H100, H100_CAP)}


# -- KV transfer ---------------------------------------------------------------------------------

LAYERWISE_MIN_PROMPT_TOKENS = 512
"""Splitwise transfers smaller prompts serialized, larger ones layer by layer (§IV-C, H100)."""


class SplitwiseCluster(Cluster):
    """`Cluster` with Splitwise's KV transfer (§IV-C, research A3.4): with `KvOverlap.LAYER`,
    prompts of at least `LAYERWISE_MIN_PROMPT_TOKENS` stream layer by layer under the prompt's
    compute, leaving the part it did not hide (at least one layer's share) plus the token
    machine's constant `kv_layer_sync_s` visible; smaller prompts, and every prompt with
    `KvOverlap.NONE`, transfer serialized after the prompt. Overrides the cluster's transfer
    time only (`Cluster.transfer_s`: same link queue, same events)."""

    def transfer_s(self, req: SimRequest, prefill: SimWorker, decode: SimWorker) -> float:
        tokens = req.item.num_prompt_tokens
        layout = decode.template.kv_layout
        dur = decode.latency.kv_transfer_s(tokens * layout.bytes_per_token)
        layered = self.spec.kv_overlap is KvOverlap.LAYER
        if layered and tokens >= LAYERWISE_MIN_PROMPT_TOKENS and dur > 0:
            hidden = prefill.latency.step_s(BatchShape(((tokens, 0),)))
            sync = getattr(decode.latency, "kv_layer_sync_s", 0.0)
            dur = max(dur / layout.num_layers, dur - hidden) + sync
        return dur


# -- the pool ledger ----------------------------------------------------------------------------


class PoolLedger:
    """The CLS's view of the pools, from the requests a cluster routed.

    A prompt machine is in the mixed pool while a token phase (or a whole request) routed to it
    is unfinished; a token machine while a prompt routed to it has not produced its first token.
    Reserved KV per machine: prompt + output blocks of every unfinished request whose token phase
    it runs, plus prompt blocks of every prompt it has not finished (SplitwiseSim's
    `sched_memory`, oracle output length included). Bound to a `Cluster` after it is built
    (`bind`); refreshed once per arrival (placements happen only at arrivals).
    """

    def __init__(self) -> None:
        self._cluster: Cluster | None = None
        self._open: list[SimRequest] = []
        self._seen = 0
        self._mixed: set[EndpointId] = set()
        self._reserved: dict[EndpointId, int] = {}
        self.history: list[tuple[float, frozenset[EndpointId]]] = []
        """(arrival time, mixed pool) each time an arrival finds the mixed pool changed."""

    def bind(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._open = []
        self._seen = 0
        self.history = []
        self._refresh()

    def _refresh(self, force: bool = False) -> None:
        cluster = self._cluster
        if cluster is None or (self._seen == len(cluster.requests) and not force):
            return
        workers = cluster.workers
        new = cluster.requests[self._seen :]
        self._seen = len(cluster.requests)
        self._open = [r for r in self._open if r.finish_s is None and not r.dropped]
        self._open.extend(new)  # the one being placed now counts once placed (decode_worker set)
        mixed: set[EndpointId] = set()
        reserved: dict[EndpointId, int] = {}
        for r in self._open:
            if r.decode_worker < 0:
                continue
            size = workers[r.decode_worker].template.block_size
            p, n = r.item.num_prompt_tokens, r.item.num_output_tokens
            t = workers[r.decode_worker]
            reserved[t.id] = reserved.get(t.id, 0) + blocks_for(p + n, size)
            if t.role is Role.PREFILL:
                mixed.add(t.id)
            prompt = t if r.prefill_worker < 0 else workers[r.prefill_worker]
            if r.first_token_s is None:
                if r.prefill_worker >= 0:
                    reserved[prompt.id] = reserved.get(prompt.id, 0) + blocks_for(p, size)
                if prompt.role is Role.DECODE:
                    mixed.add(prompt.id)
        if mixed != self._mixed and cluster.requests and not force:
            self.history.append((cluster.requests[-1].item.arrival_s, frozenset(mixed)))
        self._mixed = mixed
        self._reserved = reserved

    def in_mixed(self, eid: EndpointId) -> bool:
        self._refresh()
        return eid in self._mixed

    def reserved_of(self, eid: EndpointId) -> int:
        self._refresh()
        return self._reserved.get(eid, 0)

    @property
    def mixed_now(self) -> frozenset[EndpointId]:
        """Machines in the mixed pool now (recomputed on every call: for inspection)."""
        self._refresh(force=True)
        return frozenset(self._mixed)


# -- cluster set-ups ----------------------------------------------------------------------------


def _profile(phase: str, ledger: PoolLedger | None) -> ProfileSpec:
    params: dict[str, object] = {"phase": phase}
    if ledger is not None:
        params |= {"in_mixed": ledger.in_mixed, "reserved_of": ledger.reserved_of}
    return ProfileSpec(
        name=f"splitwise-{phase}",
        filters=(PluginSpec("splitwise-pool", params=params),),
        scorers=(PluginSpec("splitwise-overflow", 1.0, params),),
    )


def splitwise_spec(
    prompt: MachineType,
    token: MachineType,
    num_prompt: int,
    num_token: int,
    ledger: PoolLedger | None = None,
    kv_overlap: KvOverlap = KvOverlap.LAYER,
) -> ClusterSpec:
    """Splitwise-<prompt><token>: a prompt pool and a token pool, the mixed pool by borrowing."""
    return ClusterSpec(
        (
            PoolSpec(PoolName("prompt"), Role.PREFILL, num_prompt, prompt.template()),
            PoolSpec(PoolName("token"), Role.DECODE, num_token, token.template()),
        ),
        decode_profile=_profile("token", ledger),
        prefill_profile=_profile("prompt", ledger),
        decider=PdDeciderParams(min_prompt_tokens_for_pd=1),
        kv_overlap=kv_overlap,
    )


def baseline_spec(machine: MachineType, num: int) -> ClusterSpec:
    """Baseline-A100/H100: every machine runs whole requests with mixed continuous batching;
    JSQ on pending tokens (SplitwiseSim's `token_jsq`)."""
    profile = ProfileSpec(
        name="baseline",
        filters=(PluginSpec("accepts-work"),),
        scorers=(PluginSpec("pending-prefill-tokens", 1.0), PluginSpec("least-loaded", 0.5)),
    )
    return ClusterSpec(
        (PoolSpec(PoolName("pt"), Role.MIXED, num, machine.template()),),
        decode_profile=profile,
        prefill_profile=default_prefill_profile(),  # no PREFILL machine: always aggregated
    )


@dataclass(frozen=True, slots=True)
class Design:
    """A cluster design: machine counts and types, with its cost and provisioned power."""

    name: str
    prompt: MachineType
    token: MachineType
    num_prompt: int
    num_token: int = 0
    """0 for a baseline (all `num_prompt` machines run whole requests)."""
    notes: tuple[str, ...] = field(default=())

    @property
    def is_baseline(self) -> bool:
        return self.num_token == 0

    @property
    def cost_per_hour(self) -> float:
        return (
            self.num_prompt * self.prompt.cost_per_hour + self.num_token * self.token.cost_per_hour
        )

    @property
    def power(self) -> float:
        return self.num_prompt * self.prompt.power + self.num_token * self.token.power

    @property
    def num_machines(self) -> int:
        return self.num_prompt + self.num_token


def simulate_splitwise(
    design: Design,
    items: Sequence[WorkItem],
    kv_overlap: KvOverlap = KvOverlap.LAYER,
    ledger: PoolLedger | None = None,
    until_s: float | None = None,
) -> SimResult:
    """Run `items` on a fresh cluster of `design` to completion (or `until_s`)."""
    sim = Simulator()
    if design.is_baseline:
        cluster = Cluster(baseline_spec(design.prompt, design.num_prompt), items)
    else:
        ledger = ledger or PoolLedger()
        spec = splitwise_spec(
            design.prompt, design.token, design.num_prompt, design.num_token, ledger, kv_overlap
        )
        cluster = SplitwiseCluster(spec, items)
        ledger.bind(cluster)
        cluster.router.decider = SplitwiseDecider(
            build_profile(spec.decode_profile), build_profile(spec.prefill_profile), spec.decider
        )
    cluster.start(sim)
    sim.run(cluster, until_s=until_s)
    return cluster.result(sim)
