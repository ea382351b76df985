"""The README's quick-start snippet returns promptly against `make run`'s stack.

The simulated engine never ends an answer by itself (its synthetic tokens hold no end of text),
so a request without `max_tokens` runs to the context limit: the snippet, as it stood, printed
4,081 tokens after about 50 s. The snippet is run here with a stand-in client that records
what it was asked.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"


def _snippet() -> str:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    shown = [b for b in blocks if "chat.completions.create" in b]
    assert len(shown) == 1, "the README shows one chat-completion snippet"
    return shown[0]


def test_the_readme_snippet_bounds_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[dict[str, Any]] = []

    class _Completions:
        def create(self, **kwargs: Any) -> Any:
            asked.append(kwargs)
            message = types.SimpleNamespace(content="text")
            return types.SimpleNamespace(
                choices=[types.SimpleNamespace(message=message)], usage=None
            )

    class _Client:
        def __init__(self, **_: Any) -> None:
            self.chat = types.SimpleNamespace(completions=_Completions())

    monkeypatch.setitem(sys.modules, "openai", types.SimpleNamespace(OpenAI=_Client))
    exec(_snippet(), {"print": lambda *_: None})
    assert len(asked) == 1
    limit = asked[0].get("max_tokens") or asked[0].get("max_completion_tokens")
    assert isinstance(limit, int), asked[0]
    assert limit <= 256
