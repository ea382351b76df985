"""Measure a Llama-shaped transformer's step times on a real GPU (torch only; no splitserve import).

Run on a GPU machine (`python3 tools/gpu_step_profile.py --out DIR`); `--tiny` runs the same code
on a CPU with a small shape as a smoke test. Random bf16 weights: step time depends on shapes,
not values. Writes into DIR:

- `ops-<model>.csv`: Vidur-style per-layer operator medians (`op,tokens,ms`) — input RMSNorm,
  QKV projection, RoPE, output projection, post-attention RMSNorm, MLP gate/up, SiLU·mul, down
  projection, residual add — at each token count, plus the embedding. The same operator split
  as Vidur's `mlp.csv` (attention is timed separately), so the sums compare with its tables.
- `profile-<model>.csv`: rows `component,x,seconds` for `splitserve.core.perf.table.
  parse_profile_csv`: `gemm` by new tokens (embedding + layers x operators + LM head),
  `prefill_attention` by causal query-key pairs, `decode_attention` by context tokens read
  (layers x one attention call each), all for the whole model.
- `steps-<model>.csv`: whole forward passes (`kind,batch,prompt_or_context,seconds`): prefill
  of one sequence of n tokens (eager; launch cost is small next to the work) and decode steps of
  b sequences at context c, captured in a CUDA graph and replayed (as vLLM runs decode), so the
  measured time is the GPU's, without Python launch overhead.
- `mixed-<model>.csv`: chunked-prefill steps (`chunk_tokens,decode_batch,decode_context,
  seconds`): one new sequence's n prompt tokens with b decoding sequences in one eager pass,
  sharing the GEMMs (as vLLM's chunked prefill runs them), to check how a model prices a mix.
- `env.json`: device, torch version, peak figures read from the device.

Attention is `torch.nn.functional.scaled_dot_product_attention` (FlashAttention / cuDNN
kernels in recent torch); decode attention is the same call with one query per sequence over a
contiguous cache, a stand-in for vLLM's paged attention (flash-decoding splits the context
further), so decode-attention figures are an upper-bound estimate of a serving engine's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    arch: str = "llama"
    """'llama': RMSNorm, RoPE, gated SiLU MLP (gate, up, down), no biases. 'opt': pre-LayerNorm
    with biases, learned positions, ReLU MLP of two matrices (fc1, fc2), biases on every linear."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "llama-2-7b": Shape("llama-2-7b", 32, 4096, 11008, 32, 32, 32000),
    "llama-3-8b": Shape("llama-3-8b", 32, 4096, 14336, 32, 8, 128256),
    "codellama-34b": Shape("codellama-34b", 48, 8192, 22016, 64, 8, 32000),
    "llama-2-13b": Shape("llama-2-13b", 40, 5120, 13824, 40, 40, 32000),
    "opt-13b": Shape("opt-13b", 40, 5120, 20480, 40, 40, 50272, arch="opt"),
    "tiny": Shape("tiny", 2, 256, 512, 4, 2, 1000),
    "tiny-opt": Shape("tiny-opt", 2, 256, 1024, 4, 4, 1000, arch="opt"),
}


class Timer:
    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.cuda = device.type == "cuda"
        self.reps, self.warmup = reps, warmup

    def median_s(self, fn, reps: int | None = None) -> float:  # type: ignore[no-untyped-def]
        reps = reps or self.reps
        for _ in range(self.warmup):
            fn()
        out = []
        if self.cuda:
            torch.cuda.synchronize()
            for _ in range(reps):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / 1000.0)
        else:
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
        return statistics.median(out)


class Layer:
    def __init__(self, s: Shape, dev: torch.device, dt: torch.dtype) -> None:
        d, hd = s.hidden, s.head_dim
        std = 0.02
        self.s = s
        self.norm1 = torch.ones(d, device=dev, dtype=dt)
        self.norm2 = torch.ones(d, device=dev, dtype=dt)
        self.qkv = torch.randn((s.heads + 2 * s.kv_heads) * hd, d, device=dev, dtype=dt) * std
        self.o = torch.randn(d, d, device=dev, dtype=dt) * std
        up = 2 * s.ffn if s.arch == "llama" else s.ffn
        self.gate_up = torch.randn(up, d, device=dev, dtype=dt) * std
        self.down = torch.randn(d, s.ffn, device=dev, dtype=dt) * std
        # OPT only: LayerNorm biases and linear-layer biases.
        self.norm1_b = torch.zeros(d, device=dev, dtype=dt)
        self.norm2_b = torch.zeros(d, device=dev, dtype=dt)
        self.qkv_b = torch.zeros(self.qkv.shape[0], device=dev, dtype=dt)
        self.o_b = torch.zeros(d, device=dev, dtype=dt)
        self.up_b = torch.zeros(up, device=dev, dtype=dt)
        self.down_b = torch.zeros(d, device=dev, dtype=dt)

    def norm(self, x: torch.Tensor, which: int) -> torch.Tensor:
        w = self.norm1 if which == 1 else self.norm2
        if self.s.arch == "opt":
            b = self.norm1_b if which == 1 else self.norm2_b
            return F.layer_norm(x, (self.s.hidden,), w, b, 1e-5)
        return F.rms_norm(x, (self.s.hidden,), w, 1e-5)

    def pre_proj(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.qkv, self.qkv_b if self.s.arch == "opt" else None)

    def post_proj(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a, self.o, self.o_b if self.s.arch == "opt" else None)

    def up_proj(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.gate_up, self.up_b if self.s.arch == "opt" else None)

    def act(self, u: torch.Tensor) -> torch.Tensor:
        if self.s.arch == "opt":
            return F.relu(u)
        return F.silu(u[:, : self.s.ffn]) * u[:, self.s.ffn :]

    def down_proj(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a, self.down, self.down_b if self.s.arch == "opt" else None)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; rotate halves (Llama's RoPE)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_tables(positions: torch.Tensor, hd: int, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=positions.device).float() / hd))
    f = positions.float()[:, None] * inv[None, :]
    return f.cos()[:, None, :].to(dt), f.sin()[:, None, :].to(dt)


def layer_ops(layer: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """The per-layer non-attention operators as closures over inputs of T tokens."""
    s = layer.s
    hd = s.head_dim
    t = x.shape[0]
    h1 = layer.norm(x, 1)
    qkv = layer.pre_proj(h1)
    q = qkv[:, : s.heads * hd].reshape(t, s.heads, hd)
    attn_out = torch.randn(t, s.hidden, device=x.device, dtype=x.dtype)
    h2 = layer.norm(x, 2)
    gu = layer.up_proj(h2)
    act = layer.act(gu)
    ops = {
        "input_layernorm": lambda: layer.norm(x, 1),
        "attn_pre_proj": lambda: layer.pre_proj(h1),
        "attn_rope": lambda: rope(q, cos, sin),
        "attn_post_proj": lambda: layer.post_proj(attn_out),
        "post_attention_layernorm": lambda: layer.norm(x, 2),
        "mlp_up_proj": lambda: layer.up_proj(h2),
        "mlp_act": lambda: layer.act(gu),
        "mlp_down_proj": lambda: layer.down_proj(act),
        "add": lambda: x + attn_out,
    }
    if s.arch == "opt":  # learned positions: no RoPE
        del ops["attn_rope"]
    return ops


class Model:
    def __init__(self, s: Shape, dev: torch.device, dt: torch.dtype) -> None:
        self.s, self.dev, self.dt = s, dev, dt
        self.emb = torch.randn(s.vocab, s.hidden, device=dev, dtype=dt) * 0.02
        self.head = torch.randn(s.vocab, s.hidden, device=dev, dtype=dt) * 0.02
        self.final_norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.final_norm_b = torch.zeros(s.hidden, device=dev, dtype=dt)
        # OPT's learned positions (OPT was trained to 2,048; the table is sized for the probes,
        # whose positions only index it)
        self.pos = torch.randn(8192 + 2, s.hidden, device=dev, dtype=dt) * 0.02
        self.layers = [Layer(s, dev, dt) for _ in range(s.layers)]

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.emb[ids]
        return x + self.pos[positions] if self.s.arch == "opt" else x

    def final(self, x: torch.Tensor) -> torch.Tensor:
        if self.s.arch == "opt":
            x = F.layer_norm(x, (self.s.hidden,), self.final_norm, self.final_norm_b, 1e-5)
        else:
            x = F.rms_norm(x, (self.s.hidden,), self.final_norm, 1e-5)
        return x @ self.head.T

    def _attn_block(
        self,
        layer: Layer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend,  # type: ignore[no-untyped-def]
    ) -> torch.Tensor:
        s, hd = self.s, self.s.head_dim
        t = x.shape[0]
        h = layer.norm(x, 1)
        qkv = layer.pre_proj(h)
        q = qkv[:, : s.heads * hd].reshape(t, s.heads, hd)
        k = qkv[:, s.heads * hd : (s.heads + s.kv_heads) * hd].reshape(t, s.kv_heads, hd)
        if s.arch == "llama":
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        v = qkv[:, (s.heads + s.kv_heads) * hd :].reshape(t, s.kv_heads, hd)
        a = attend(q, k, v)
        x = x + layer.post_proj(a.reshape(t, s.hidden))
        h = layer.norm(x, 2)
        return x + layer.down_proj(layer.act(layer.up_proj(h)))

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        s = self.s
        n = ids.shape[0]
        cos, sin = rope_tables(torch.arange(n, device=self.dev), s.head_dim, self.dt)

        def attend(q, k, v):  # type: ignore[no-untyped-def]
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                is_causal=True,
                enable_gqa=s.kv_heads != s.heads,
            )
            return o[0].transpose(0, 1)

        x = self.embed(ids, torch.arange(n, device=self.dev))
        for layer in self.layers:
            x = self._attn_block(layer, x, cos, sin, attend)
        return self.final(x[-1:])

    def mixed(
        self, chunk_ids: torch.Tensor, ids: torch.Tensor, cache: torch.Tensor, ctx: int
    ) -> torch.Tensor:
        """One chunked-prefill step: a new sequence's `n` prompt tokens (causal among
        themselves) and b decoding sequences at context `ctx`, sharing every GEMM."""
        s = self.s
        n, b = chunk_ids.shape[0], ids.shape[0]
        pos = torch.cat((torch.arange(n, device=self.dev), torch.full((b,), ctx, device=self.dev)))
        cos, sin = rope_tables(pos, s.head_dim, self.dt)
        gqa = s.kv_heads != s.heads
        x = self.embed(torch.cat((chunk_ids, ids)), pos)
        for i, layer in enumerate(self.layers):
            kc, vc = cache[i, 0], cache[i, 1]

            def attend(q, k, v, kc=kc, vc=vc):  # type: ignore[no-untyped-def]
                p = F.scaled_dot_product_attention(
                    q[:n].transpose(0, 1)[None],
                    k[:n].transpose(0, 1)[None],
                    v[:n].transpose(0, 1)[None],
                    is_causal=True,
                    enable_gqa=gqa,
                )[0].transpose(0, 1)
                kc[:, :, ctx] = k[n:]
                vc[:, :, ctx] = v[n:]
                d = F.scaled_dot_product_attention(q[n:, :, None, :], kc, vc, enable_gqa=gqa)
                return torch.cat((p, d[:, :, 0, :]))

            x = self._attn_block(layer, x, cos, sin, attend)
        return self.final(x[n - 1 :])

    def decode(
        self, ids: torch.Tensor, cache: torch.Tensor, ctx: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """One decode step of b sequences (ids: [b]) at context `ctx`; cache
        [layers, 2, b, kv_heads, ctx + 1, head_dim], position ctx written this step."""
        s = self.s
        x = self.embed(ids, torch.full_like(ids, ctx))
        for i, layer in enumerate(self.layers):
            kc, vc = cache[i, 0], cache[i, 1]

            def attend(q, k, v, kc=kc, vc=vc):  # type: ignore[no-untyped-def]
                kc[:, :, ctx] = k
                vc[:, :, ctx] = v
                o = F.scaled_dot_product_attention(
                    q[:, :, None, :], kc, vc, enable_gqa=s.kv_heads != s.heads
                )
                return o[:, :, 0, :]

            x = self._attn_block(layer, x, cos, sin, attend)
        return self.final(x)


def profile_ops(s: Shape, timer: Timer, dev: torch.device, dt: torch.dtype, tokens: list[int]):  # type: ignore[no-untyped-def]
    layer = Layer(s, dev, dt)
    emb = torch.randn(s.vocab, s.hidden, device=dev, dtype=dt) * 0.02
    head = torch.randn(s.vocab, s.hidden, device=dev, dtype=dt) * 0.02
    rows, gemm = [], []
    for t in tokens:
        x = torch.randn(t, s.hidden, device=dev, dtype=dt)
        cos, sin = rope_tables(torch.arange(t, device=dev), s.head_dim, dt)
        layer_s = 0.0
        for op, fn in layer_ops(layer, x, cos, sin).items():
            sec = timer.median_s(fn)
            layer_s += sec
            rows.append((op, t, sec * 1e3))
        ids = torch.randint(0, s.vocab, (t,), device=dev)
        emb_s = timer.median_s(lambda ids=ids: emb[ids])
        rows.append(("emb", t, emb_s * 1e3))
        # The LM head runs on the last token of each sequence; a step of T new tokens is
        # priced with one row per token here (decode: every token is a sequence's last).
        h = torch.randn(t, s.hidden, device=dev, dtype=dt)
        head_s = timer.median_s(lambda h=h: h @ head.T)
        rows.append(("lm_head", t, head_s * 1e3))
        gemm.append((t, emb_s + s.layers * layer_s + head_s))
    return rows, gemm


def profile_attention(s: Shape, timer: Timer, dev: torch.device, dt: torch.dtype, tiny: bool):  # type: ignore[no-untyped-def]
    hd, gqa = s.head_dim, s.kv_heads != s.heads
    pre = []
    for n in [16, 64] if tiny else [128, 256, 512, 1024, 2048, 4096, 8192]:
        q = torch.randn(1, s.heads, n, hd, device=dev, dtype=dt)
        k = torch.randn(1, s.kv_heads, n, hd, device=dev, dtype=dt)
        v = torch.randn(1, s.kv_heads, n, hd, device=dev, dtype=dt)
        sec = timer.median_s(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=gqa
            )
        )
        pre.append((n * (n + 1) / 2.0, s.layers * sec, n))
    dec = []
    grid = [(1, 64), (4, 64)] if tiny else [
        (1, 512), (1, 2048), (1, 8192), (8, 512), (8, 2048), (8, 8192),
        (32, 512), (32, 2048), (64, 1024), (128, 512), (256, 256),
    ]  # fmt: skip
    for b, c in grid:
        q = torch.randn(b, s.heads, 1, hd, device=dev, dtype=dt)
        k = torch.randn(b, s.kv_heads, c, hd, device=dev, dtype=dt)
        v = torch.randn(b, s.kv_heads, c, hd, device=dev, dtype=dt)
        sec = timer.median_s(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        )
        dec.append((b * c, s.layers * sec, b, c))
    return pre, dec


def whole_steps(s: Shape, timer: Timer, dev: torch.device, dt: torch.dtype, tiny: bool):  # type: ignore[no-untyped-def]
    model = Model(s, dev, dt)
    out = []
    with torch.inference_mode():
        for n in [16, 64] if tiny else [128, 512, 1024, 2048, 4096, 8192]:
            ids = torch.randint(0, s.vocab, (n,), device=dev)
            sec = timer.median_s(lambda ids=ids: model.prefill(ids), reps=max(3, timer.reps // 3))
            out.append(("prefill", 1, n, sec))
        grid = [(1, 16), (2, 32)] if tiny else [
            (1, 512), (1, 2048), (1, 8192), (8, 512), (8, 2048), (32, 512), (32, 2048),
            (64, 1024), (128, 512), (256, 256),
        ]  # fmt: skip
        for b, c0 in grid:
            # where b x c does not fit beside the weights, halve the context (down to 64):
            # the decode fit needs g[b] at every batch size, at whatever context fits
            c = c0
            while c > 64 and not _fits(s, b, c + 1, dev, dt):
                c //= 2
            if not _fits(s, b, c + 1, dev, dt):
                print(f"{s.name}: decode {b} x {c0} skipped (GPU memory)", flush=True)
                continue
            if c != c0:
                print(f"{s.name}: decode {b} x {c0} measured at context {c} (GPU memory)")
            cache = torch.zeros(s.layers, 2, b, s.kv_heads, c + 1, s.head_dim, device=dev, dtype=dt)
            ids = torch.randint(0, s.vocab, (b,), device=dev)
            cos, sin = rope_tables(torch.full((b,), c, device=dev), s.head_dim, dt)
            if dev.type == "cuda":
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        model.decode(ids, cache, c, cos, sin)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model.decode(ids, cache, c, cos, sin)
                sec = timer.median_s(graph.replay)
                del graph
            else:
                sec = timer.median_s(
                    lambda ids=ids, cache=cache, c=c, cos=cos, sin=sin: model.decode(
                        ids, cache, c, cos, sin
                    )
                )
            out.append(("decode", b, c, sec))
            del cache
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        mixed = []
        ctx = 16 if tiny else 1024
        for n, b in [(8, 2)] if tiny else [(256, 8), (512, 8), (512, 32), (1024, 32), (1024, 64)]:
            if not _fits(s, b, ctx + 1, dev, dt):
                continue
            cache = torch.zeros(
                s.layers, 2, b, s.kv_heads, ctx + 1, s.head_dim, device=dev, dtype=dt
            )
            chunk = torch.randint(0, s.vocab, (n,), device=dev)
            ids = torch.randint(0, s.vocab, (b,), device=dev)
            sec = timer.median_s(
                lambda chunk=chunk, ids=ids, cache=cache: model.mixed(chunk, ids, cache, ctx),
                reps=max(3, timer.reps // 3),
            )
            mixed.append((n, b, ctx, sec))
            del cache
    return out, mixed


def _fits(s: Shape, b: int, c: int, dev: torch.device, dt: torch.dtype) -> bool:
    """Whether a KV cache of b x c tokens fits in free GPU memory with 4 GiB to spare."""
    if dev.type != "cuda":
        return True
    need = s.layers * 2 * b * s.kv_heads * c * s.head_dim * torch.finfo(dt).bits // 8
    free, _total = torch.cuda.mem_get_info()
    return need + (4 << 30) < free


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny shape")
    ap.add_argument("--skip-steps", action="store_true", help="operators only")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    timer = Timer(dev, a.reps, warmup=5)
    env = {"torch": torch.__version__, "device": str(dev), "dtype": str(dt)}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        env |= {"gpu": p.name, "sms": p.multi_processor_count, "mem_gib": p.total_memory / 2**30}
        torch.backends.cuda.matmul.allow_tf32 = True
    models = ["tiny", "tiny-opt"] if a.tiny else a.models.split(",")
    tokens = [1, 4, 16, 64] if a.tiny else [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192,
    ]  # fmt: skip
    t0 = time.perf_counter()
    for name in models:
        s = SHAPES[name]
        rows, gemm = profile_ops(s, timer, dev, dt, tokens)
        pre, dec = profile_attention(s, timer, dev, dt, a.tiny)
        with (a.out / f"ops-{name}.csv").open("w") as f:
            f.write("op,tokens,ms\n")
            f.writelines(f"{op},{t},{ms:.6f}\n" for op, t, ms in rows)
        with (a.out / f"profile-{name}.csv").open("w") as f:
            f.write(f"# {name} on {env.get('gpu', dev.type)} ({dt}), torch {torch.__version__}\n")
            f.write("component,x,seconds\n")
            f.writelines(f"gemm,{t},{sec:.9f}\n" for t, sec in gemm)
            f.writelines(f"prefill_attention,{w:.1f},{sec:.9f}\n" for w, sec, _ in pre)
            f.writelines(f"decode_attention,{x},{sec:.9f}\n" for x, sec, _, _ in dec)
        print(
            f"{name}: operators and attention done at {time.perf_counter() - t0:.1f}s", flush=True
        )
        if not a.skip_steps:
            steps, mixed = whole_steps(s, timer, dev, dt, a.tiny)
            with (a.out / f"mixed-{name}.csv").open("w") as f:
                f.write("chunk_tokens,decode_batch,decode_context,seconds\n")
                f.writelines(f"{n},{b},{c},{sec:.9f}\n" for n, b, c, sec in mixed)
            with (a.out / f"steps-{name}.csv").open("w") as f:
                f.write("kind,batch,prompt_or_context,seconds\n")
                f.writelines(f"{k},{b},{n},{sec:.9f}\n" for k, b, n, sec in steps)
            print(f"{name}: whole steps done at {time.perf_counter() - t0:.1f}s", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    env["seconds"] = round(time.perf_counter() - t0, 1)
    (a.out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)
    assert math.isfinite(env["seconds"])


if __name__ == "__main__":
    main()
