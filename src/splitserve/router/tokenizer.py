"""The router's tokenizer: a Hugging Face tokenizer loaded from a model directory, plus a default.

The router tokenizes once (prompt text or chat messages -> token ids) and sends ids to workers.
`build_default_tokenizer` trains a small byte-level BPE on a fixed list of Python standard-library
sources, so a fresh machine (CI, `splitserve up` with the simulated engine) has a real tokenizer
with a chat template and no download. Loading and training are blocking; call them at start-up.
"""

from __future__ import annotations

import logging
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

BOS: Final = "<|begin_of_text|>"
EOS: Final = "<|end_of_text|>"
PAD: Final = "<|pad|>"
START_HEADER: Final = "<|start_header_id|>"
END_HEADER: Final = "<|end_header_id|>"
END_OF_TURN: Final = "<|eot_id|>"
DEFAULT_VOCAB_SIZE: Final = 4096

_CHAT_TEMPLATE: Final = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Modules present (as `name.py` or `name/__init__.py`) in every supported Python; the order is
# part of the training input, so the tokenizer is the same on every machine with that Python.
_TRAINING_MODULES: Final = (
    "argparse",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "json/decoder",
    "json/encoder",
    "shlex",
    "textwrap",
    "typing",
)
# A little non-ASCII text, so common multi-byte characters get merges of their own.
_EXTRA_TEXT: Final = (
    "Grüße aus Köln. Ça va très bien, merci. ¿Dónde está la estación? Цена 5 €. "
    "東京は晴れです。日本語のテキスト。 你好，世界。 안녕하세요. Emoji: 🙂 🚀 ✅. "
) * 8

MessageLike = Mapping[str, Any]


class TextTokenizer:
    """A Hugging Face tokenizer behind the few calls the router needs."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        stops = [hf.eos_token_id]
        eot = hf.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in hf.get_vocab() else None
        if eot is not None:
            stops.append(eot)
        self.stop_token_ids: tuple[int, ...] = tuple(
            sorted({int(t) for t in stops if t is not None})
        )
        """Token ids that end a completion (end of text, end of turn)."""

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> TextTokenizer:
        """Load the tokenizer files under `path` (tokenizer.json, tokenizer_config.json, ...)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(os.fspath(path)))

    @property
    def vocab_size(self) -> int:
        return len(self._hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, with the tokenizer's own special-token handling."""
        return list(self._hf.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(
            self._hf.decode(
                list(token_ids),
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        )

    def apply_chat_template(self, messages: Sequence[MessageLike]) -> list[int]:
        """Render chat messages with the model's template (generation prompt added) and encode.

        Raises:
            ValueError: the tokenizer has no chat template, or the template rejected the messages.
        """
        if not self.has_chat_template:
            raise ValueError("the served model's tokenizer has no chat template")
        try:
            text = self._hf.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # jinja2 errors, template `raise_exception` calls
            raise ValueError(f"chat template failed: {err}") from err
        # The template writes the special tokens itself (BOS included): add none here.
        return list(self._hf.encode(str(text), add_special_tokens=False))


def _training_texts() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in _TRAINING_MODULES:
        for candidate in (stdlib / f"{name}.py", stdlib / name / "__init__.py"):
            if candidate.is_file():
                texts.append(candidate.read_text(encoding="utf-8"))
                break
    if not texts:
        raise RuntimeError(f"no training sources found under {stdlib}")
    texts.append(_EXTRA_TEXT)
    return texts


def build_default_tokenizer(dest_dir: str | os.PathLike[str]) -> Path:
    """Train the default byte-level BPE tokenizer and save it under `dest_dir`.

    Deterministic for a given Python version (fixed inputs in a fixed order). Takes well under a
    second. Returns `dest_dir` as a `Path`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [BOS, EOS, PAD, START_HEADER, END_HEADER, END_OF_TURN]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=DEFAULT_VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(), trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[START_HEADER, END_HEADER, END_OF_TURN],
        model_max_length=1 << 20,
    )
    fast.chat_template = _CHAT_TEMPLATE
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(os.fspath(dest))
    return dest


def default_tokenizer_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """The default tokenizer cached under `cache_dir`, built there on first use.

    Safe against concurrent first uses: the tokenizer is built in a sibling temporary directory
    and moved into place; whoever loses the race keeps the winner's copy.
    """
    dest = Path(cache_dir)
    if (dest / "tokenizer.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build_default_tokenizer(tmp)
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / "tokenizer.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the default tokenizer in %s", dest)
    return dest
