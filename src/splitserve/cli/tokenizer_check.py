"""Load a tokenizer given on a command line, or refuse it in one line naming the flag.

transformers fails a hub id it cannot load (offline, `HF_HUB_OFFLINE=1` with nothing cached, no
such repository) or a directory without tokenizer files with a traceback of 20-60 lines from
deep inside a command's start-up. Every command that loads such a tokenizer (`router serve`,
`up`, `worker serve --engine vllm`) loads it through `load_tokenizer` first, so the failure is
a usage error naming the flag, the value, what was tried, and transformers' reason (one line).

Loading is what is checked (not a list of expected files): what transformers accepts varies by
tokenizer class, and the loader is the same one the command then uses. The hub is reached only
as transformers would reach it anyway (`HF_HUB_OFFLINE` is honoured, nothing else is tried).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import click

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
)
"""Files a Hugging Face tokenizer directory usually holds (named in the refusal only)."""

LOAD_ERRORS: tuple[type[Exception], ...] = (
    OSError,  # not found, offline, no files (transformers' EnvironmentError)
    ValueError,  # no backend could be built from the files; bad JSON
    KeyError,  # a config naming an unknown tokenizer class
    TypeError,
    AttributeError,
    ImportError,  # a tokenizer class needing a package that is not installed (sentencepiece)
)
"""What `AutoTokenizer.from_pretrained` raises for a value that is no loadable tokenizer."""

_REASON_CHARS = 300


def reason(err: BaseException) -> str:
    """transformers' message on one line (its messages span several), shortened."""
    text = re.sub(r"\s+", " ", str(err)).strip() or type(err).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def hub_offline() -> bool:
    """Whether the hub client runs offline (`HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE`), as the
    loader itself reads it."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def refusal(value: str, err: BaseException) -> str:
    """What was tried for `value` and why it failed, for a `--tokenizer`-like flag."""
    path = Path(value).expanduser()
    if path.is_dir():
        have = [f for f in TOKENIZER_FILES if (path / f).is_file()]
        what = (
            f"a directory with {', '.join(have)}"
            if have
            else f"a directory without tokenizer files ({', '.join(TOKENIZER_FILES)})"
        )
        return f"{value!r}: {what}; transformers loads no tokenizer from it: {reason(err)}"
    where = (
        "the local Hugging Face cache only (HF_HUB_OFFLINE is set)"
        if hub_offline()
        else "the Hugging Face hub and the local cache"
    )
    return (
        f"{value!r}: no such directory, and no tokenizer of that hub id could be loaded from "
        f"{where}: {reason(err)}"
    )


def load_tokenizer(value: str | os.PathLike[str], flag: str, revision: str | None = None) -> Any:
    """`AutoTokenizer.from_pretrained(value, revision=revision)`, or a `click.BadParameter`
    naming `flag` (a revision matters for a hub id only; a directory has one version).

    `flag` is what the user set (`--tokenizer`, `--model`, or a config file's field)."""
    from transformers import AutoTokenizer

    text = os.fspath(value)
    try:
        if revision is None:
            return AutoTokenizer.from_pretrained(text)
        return AutoTokenizer.from_pretrained(text, revision=revision)
    except LOAD_ERRORS as err:
        raise click.BadParameter(refusal(text, err), param_hint=flag) from None
