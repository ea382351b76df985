"""vLLM's `add_special_tokens` on completions: `false` encodes a text prompt without the start
token the tokenizer adds (before: refused as an unknown field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.core.roles import Role
from splitserve.router.tokenizer import BOS, TextTokenizer, build_default_tokenizer
from tests.unit.router.conftest import MODEL, StackFactory, WorkerFactory


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """The default tokenizer made to start every text with BOS (as Llama's do)."""
    from tokenizers import Tokenizer, processors

    d = Path(build_default_tokenizer(tmp_path_factory.mktemp("bos")))
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos)]
    )
    tok.save(str(d / "tokenizer.json"))
    return TextTokenizer.from_dir(d)


@pytest.mark.parametrize("add", [True, False, None])
async def test_add_special_tokens(
    make_worker: WorkerFactory, make_stack: StackFactory, tokenizer: TextTokenizer, add: bool | None
) -> None:
    w = await make_worker(Role.MIXED)
    stack = await make_stack(w)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2}
    if add is not None:
        body["add_special_tokens"] = add
    async with stack.client() as client:
        r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    [gen] = w.requests("Generate")
    bare = tokenizer.encode("Once upon a time", add_special_tokens=False)
    bos = tokenizer.encode("x")[0]
    expected = bare if add is False else [bos, *bare]
    assert list(gen.prompt_token_ids) == expected
