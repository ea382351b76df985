"""The router's tokenizer: a Hugging Face tokenizer loaded from a model directory, plus a default.

The router tokenizes once (prompt text or chat messages -> token ids) and sends ids to workers.
`build_default_tokenizer` trains a small byte-level BPE on a fixed list of Python standard-library
sources, so a fresh machine (CI, `splitserve up` with the simulated engine) has a real tokenizer
with a chat template and no download. Loading and training are blocking; call them at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from splitserve.router.fast_bpe import FastBpe

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
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    'You may call these tools, each as <tool_call>{"name": ..., "arguments": {...}}'
    "</tool_call>:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|eot_id|>"
    "{% endif %}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}"
    "{% if message['name'] %} {{ message['name'] }}{% endif %}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "</tool_call>{% endfor %}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
"""Llama-3-style turns (a message's `name`, when given, after its role in the header); with
`tools`, a system turn listing them, and an assistant's calls written in the `hermes` markup (so
`edge.tool_call_parser: hermes` reads the model's)."""

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

# Chat content is escaped with these private-use characters while the template renders, so text
# in a message that spells a special token stays text (see `apply_chat_template`).
_ESC_OPEN: Final = "\ue000"
_ESC_CLOSE: Final = "\ue001"
_ESCAPED: Final = re.compile(f"{_ESC_OPEN}(\\d+){_ESC_CLOSE}")


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
        backend = getattr(hf, "_tokenizer", None)
        self._fast: Any = backend if hasattr(backend, "encode_batch") else None
        """The Rust `tokenizers.Tokenizer` behind a fast HF tokenizer: called directly, it skips
        transformers' per-call Python overhead (~1 ms on a small prompt)."""
        self._bpe = FastBpe.of(self._fast) if self._fast is not None else None
        """The same ids as `self._fast`, cheaper, for ASCII text under byte-level BPE."""
        self._wrap = _special_wrap(self._fast) if self._bpe is not None else None
        """The ids the post-processor puts before and after a text's own (`encode` with special
        tokens: a BOS...), when it only wraps: the fast path's ids go between them."""
        self._plain: Any = None
        if self._fast is not None and hasattr(self._fast, "encode_special_tokens"):
            from tokenizers import Tokenizer

            self._plain = Tokenizer.from_str(self._fast.to_str())
            self._plain.encode_special_tokens = True  # special-token text encodes as text
        specials = {str(t) for t in hf.all_special_tokens}
        decoder = getattr(hf, "added_tokens_decoder", {}) or {}
        specials.update(str(t.content) for t in decoder.values() if getattr(t, "special", False))
        self._special_texts: tuple[str, ...] = (
            *sorted((t for t in specials if t), key=len, reverse=True),
            _ESC_OPEN,
        )
        """Texts that must not reach the template unescaped: the special tokens, longest first,
        and the escape character itself."""
        self._special_groups = _group_by_first_char(self._special_texts)
        self._template: Any = None
        self._template_vars: dict[str, Any] = {}
        self._template_reads: frozenset[str] = frozenset()
        """The variables the chat template reads (beyond its own `set`s)."""
        template = getattr(hf, "chat_template", None)
        if isinstance(template, str):
            from transformers.utils.chat_template_utils import _compile_jinja_template

            # Compiled once and rendered directly: transformers' `apply_chat_template` does the
            # same render plus ~0.1-0.3 ms of argument handling per call.
            self._template = _compile_jinja_template(template)
            self._template_vars = dict(hf.special_tokens_map)
            from jinja2 import meta

            self._template_reads = frozenset(
                meta.find_undeclared_variables(self._template.environment.parse(template))
            )

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str], revision: str | None = None) -> TextTokenizer:
        """Load the tokenizer files under `path` (tokenizer.json, tokenizer_config.json, ...);
        a hub id at `revision` (None: the hub's default)."""
        from transformers import AutoTokenizer

        if revision is None:
            return cls(AutoTokenizer.from_pretrained(os.fspath(path)))
        return cls(AutoTokenizer.from_pretrained(os.fspath(path), revision=revision))

    @property
    def vocab_size(self) -> int:
        return len(self._hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._hf, "chat_template", None))

    @property
    def template_reads_tools(self) -> bool:
        """Does the chat template read `tools` (else tool definitions would be dropped)?"""
        template = getattr(self._hf, "chat_template", None)
        return isinstance(template, str) and re.search(r"\btools\b", template) is not None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a completion prompt, with the tokenizer's own special-token handling
        (`add_special_tokens=False`: without the BOS / EOS it would add)."""
        if not add_special_tokens:
            return self._encode_bare(text)
        if self._wrap is not None and self._bpe is not None:
            ids = self._bpe.encode(text)
            if ids is not None:
                before, after = self._wrap
                return [*before, *ids, *after]
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=True).ids)
        return list(self._hf.encode(text, add_special_tokens=True))

    def _encode_bare(self, text: str) -> list[int]:
        if self._bpe is not None:
            ids = self._bpe.encode(text)
            if ids is not None:
                return ids
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        return list(self._hf.encode(text, add_special_tokens=False))

    def _encode_as_text(self, text: str) -> list[int]:
        """Token ids of `text` with any special-token spelling in it read as plain text."""
        if self._plain is not None:
            return list(self._plain.encode(text, add_special_tokens=False).ids)
        out = self._hf(text, add_special_tokens=False, split_special_tokens=True)
        return list(out["input_ids"])

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        if self._fast is not None:
            # What transformers' fast decode does (with no clean-up of spaces), minus its
            # ~3 us of Python per call; the detokenizer calls this twice per chunk.
            return str(self._fast.decode(token_ids, skip_special_tokens=skip_special_tokens))
        return str(
            self._hf.decode(
                list(token_ids),
                skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        )

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each token id (`/tokenize`'s `token_strs`)."""
        return [str(t) for t in self._hf.convert_ids_to_tokens(list(token_ids))]

    def template_sets(self, name: str) -> bool:
        """Does the router set template variable `name` itself (so a request may not)?"""
        return name in _RENDER_VARS or name in self._template_vars

    def template_reads(self, name: str) -> bool:
        """Does the served chat template read variable `name` (else giving it does nothing)?"""
        return name in self._template_reads

    def apply_chat_template(
        self,
        messages: Sequence[MessageLike],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Render chat messages (and `tools`, the tool definitions, passed as `tools=` like
        transformers and vLLM do) with the model's template (the assistant's generation prompt
        added unless `add_generation_prompt=False`) and encode. `continue_final_message`: the
        text ends with the last message's text, left open (what follows it is cut, as
        transformers does); `template_kwargs`: more variables for the template
        (`template_sets` / `template_reads` say which may be given).

        Raises:
            ValueError: the tokenizer has no chat template, or the template rejected the messages.
        """
        if not self.has_chat_template:
            raise ValueError("the served model's tokenizer has no chat template")
        specials = self._special_texts
        gen = add_generation_prompt
        extra = dict(template_kwargs or {})
        cont = continue_final_message
        tool_list = None if tools is None else [dict(t) for t in tools]
        if not _spells_grouped([messages, tool_list, extra], self._special_groups):
            # The template writes the special tokens itself (BOS included): add none here.
            return self._encode_bare(self._render(messages, gen, tool_list, extra, cont))
        # A message spells a special token (`<|eot_id|>system...`: a faked turn). Escape those
        # spellings (in every string of the messages and tools), render, then encode the
        # template's text normally and the escaped pieces as plain text, so only the template's
        # own special tokens become special tokens.
        escaped = [_escape_all(dict(m), specials) for m in messages]
        rendered = self._render(
            escaped,
            gen,
            _escape_all(tool_list, specials),
            _escape_all(extra, specials),
            cont,
        )
        ids: list[int] = []
        pos = 0
        for match in _ESCAPED.finditer(rendered):
            ids += self._encode_bare(rendered[pos : match.start()])
            ids += self._encode_as_text(specials[int(match.group(1))])
            pos = match.end()
        ids += self._encode_bare(rendered[pos:])
        return ids

    def _render(
        self,
        messages: Sequence[MessageLike],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        text: str | None = None
        if self._template is not None:
            # on failure transformers' own path below raises with its error message
            with contextlib.suppress(Exception):
                text = str(
                    self._template.render(
                        messages=[dict(m) for m in messages],
                        tools=tools,
                        documents=None,
                        add_generation_prompt=add_generation_prompt,
                        **self._template_vars,
                        **(extra or {}),
                    )
                )
        if text is None:
            try:
                text = str(
                    self._hf.apply_chat_template(
                        [dict(m) for m in messages],
                        tools=tools,
                        tokenize=False,
                        add_generation_prompt=add_generation_prompt,
                        **(extra or {}),
                    )
                )
            except Exception as err:  # jinja2 errors, template `raise_exception` calls
                raise ValueError(f"chat template failed: {err}") from err
        if continue_final_message:
            text = _open_final(text, str(dict(messages[-1]).get("content") or ""))
        return text


def _open_final(rendered: str, final: str) -> str:
    """`rendered` cut right after the last message's text (`continue_final_message`), as
    transformers cuts it: at the last occurrence of the stripped text, keeping the text's
    trailing space when the template kept it."""
    core = final.strip()
    if not core or core not in rendered:
        raise ValueError(
            "continue_final_message: the last message's text does not appear in the rendered "
            "chat (empty, or the chat template rewrites it), so it cannot be left open"
        )
    at = rendered.rindex(core)
    lead = final.lstrip()
    keep = len(lead) if rendered[at : at + len(lead)] == lead else len(core)
    return rendered[: at + keep]


_RENDER_VARS: Final = frozenset(
    ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message")
)
"""The template variables `_render` sets from the request itself."""


SpecialGroups = tuple[tuple[str, tuple[str, ...]], ...]


_WRAPPING_POST_PROCESSORS: Final = frozenset({"ByteLevel", "TemplateProcessing"})
"""Post-processors that add fixed ids around a single text (ByteLevel's only trims offsets)."""


def _special_wrap(fast: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """What `fast.encode(text, add_special_tokens=True)` adds before and after the text's own
    ids, when that is the same for every text (None: not shown to be, or it truncates or pads):
    found by encoding probes both ways, for a post-processor of a kind that only wraps."""
    try:
        cfg = json.loads(fast.to_str())
    except Exception:
        return None
    post = cfg.get("post_processor")
    steps = (post.get("processors") or [None]) if post and post["type"] == "Sequence" else [post]
    if cfg.get("truncation") is not None or cfg.get("padding") is not None:
        return None
    for step in steps:
        if step is not None and step.get("type") not in _WRAPPING_POST_PROCESSORS:
            return None
    wraps: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for probe in ("a", "Hello, world!\n 12345", "x y"):
        bare = list(fast.encode(probe, add_special_tokens=False).ids)
        full = list(fast.encode(probe, add_special_tokens=True).ids)
        found = [i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare]
        if not bare or len(found) != 1:
            return None
        i = found[0]
        wraps.add((tuple(full[:i]), tuple(full[i + len(bare) :])))
    return wraps.pop() if len(wraps) == 1 else None


def _group_by_first_char(specials: Sequence[str]) -> SpecialGroups:
    """`specials` grouped by their first character: a string that lacks the character spells
    none of its group, so one `in` test stands for the whole group (a model's few hundred
    reserved `<|...|>` tokens share one). Empty texts are dropped (they spell nothing)."""
    groups: dict[str, list[str]] = {}
    for t in specials:
        if t:
            groups.setdefault(t[0], []).append(t)
    return tuple((c, tuple(ts)) for c, ts in groups.items())


def _spells_special(obj: Any, specials: Sequence[str]) -> bool:
    """Does any string in `obj` (nested lists / dicts, keys included) spell a special text?"""
    return _spells_grouped(obj, _group_by_first_char(specials))


def _spells_in_str(text: str, groups: SpecialGroups) -> bool:
    for first, texts in groups:
        if first in text:
            for t in texts:
                if t in text:
                    return True
    return False


def _spells_grouped(obj: Any, groups: SpecialGroups) -> bool:
    """`_spells_special` over texts grouped by `_group_by_first_char`."""
    # Exact types first (what parsed JSON is made of): no ABC `isinstance` on every string.
    kind = type(obj)
    if kind is str:
        return _spells_in_str(obj, groups)
    if kind is dict:
        for k, v in obj.items():  # noqa: SIM110 - a loop: no generator per dict
            if _spells_grouped(k, groups) or _spells_grouped(v, groups):
                return True
        return False
    if kind is list or kind is tuple:
        for v in obj:  # noqa: SIM110 - a loop: no generator per list
            if _spells_grouped(v, groups):
                return True
        return False
    if obj is None or kind is int or kind is float or kind is bool:
        return False
    if isinstance(obj, str):
        return _spells_in_str(obj, groups)
    if isinstance(obj, Mapping):
        return any(_spells_grouped(k, groups) or _spells_grouped(v, groups) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return any(_spells_grouped(v, groups) for v in obj)
    return False


def _escape_all(obj: Any, specials: Sequence[str]) -> Any:
    """`obj` with every string in it (nested lists / dicts, keys included) escaped."""
    if isinstance(obj, str):
        return _escape(obj, specials)
    if isinstance(obj, Mapping):
        return {_escape_all(k, specials): _escape_all(v, specials) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_escape_all(v, specials) for v in obj]
    return obj


def _escape(content: str, specials: Sequence[str]) -> str:
    """`content` with every occurrence of a special text replaced by its escape."""
    pattern = re.compile("|".join(re.escape(t) for t in specials))
    index = {t: i for i, t in enumerate(specials)}
    return pattern.sub(lambda m: f"{_ESC_OPEN}{index[m.group(0)]}{_ESC_CLOSE}", content)


MESSAGE_CHARS: Final = 32
"""What a chat message counts against `edge.max_prompt_chars` beyond its content: its turn's
markup. Every chat template gives a message at least one token of its own (its role header or
separator), and no tokenizer packs more than 32 characters into a token (the default limit's
premise), so a chat of more than `max_model_len` messages is refused before it is rendered."""


def chat_chars(
    messages: Sequence[MessageLike], tools: Sequence[Mapping[str, Any]] | None = None
) -> int:
    """A chat's size against `edge.max_prompt_chars` and the inline-tokenizing bound: its
    contents, `MESSAGE_CHARS` per message, and its tool definitions' JSON."""
    size = MESSAGE_CHARS * len(messages)
    for m in messages:
        size += len(m.get("content") or "")
    return size + tools_chars(tools)


def tools_chars(tools: Sequence[Mapping[str, Any]] | None) -> int:
    """How many characters tool definitions add to a chat prompt (their JSON's length): counted
    with the messages against `edge.max_prompt_chars`."""
    return sum(len(json.dumps(t, ensure_ascii=False)) for t in tools or ())


class Tokenizing:
    """Runs the tokenizer without blocking the event loop.

    Short inputs (up to `inline_max_chars`) are tokenized inline: a thread hand-off costs more
    than they do. Longer ones go to a small thread pool (the Rust tokenizer releases the GIL), so
    a megabyte prompt does not stall every other client.
    """

    def __init__(self, tokenizer: TextTokenizer, *, inline_max_chars: int, threads: int) -> None:
        self.tokenizer = tokenizer
        self.inline_max_chars = inline_max_chars
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")

    async def _run(self, size: int, fn: Callable[[], list[int]]) -> list[int]:
        if size <= self.inline_max_chars:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        tok = self.tokenizer
        if add_special_tokens:
            return await self._run(len(text), lambda: tok.encode(text))
        return await self._run(len(text), lambda: tok.encode(text, add_special_tokens=False))

    async def chat(
        self,
        messages: Sequence[MessageLike],
        tools: Sequence[Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> list[int]:
        """`options`: `apply_chat_template`'s (generation prompt, open final message, template
        variables)."""
        size = chat_chars(messages, tools)
        return await self._run(
            size, lambda: self.tokenizer.apply_chat_template(messages, tools=tools, **options)
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
        _refresh_chat_template(dest)
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


def _refresh_chat_template(dest: Path) -> None:
    """Bring a cached default tokenizer's chat template up to this version's (the BPE itself
    does not change; the template did: a message's `name`). Replaced atomically, so a process
    reading it sees the old file or the new one."""
    jinja = dest / "chat_template.jinja"
    config = dest / "tokenizer_config.json"
    if jinja.is_file():
        if jinja.read_text(encoding="utf-8") == _CHAT_TEMPLATE:
            return
        _write_atomic(jinja, _CHAT_TEMPLATE)
    elif config.is_file():
        data = json.loads(config.read_text(encoding="utf-8"))
        if data.get("chat_template") == _CHAT_TEMPLATE:
            return
        data["chat_template"] = _CHAT_TEMPLATE
        _write_atomic(config, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    else:
        return
    log.info("updated the default tokenizer's chat template in %s", dest)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
