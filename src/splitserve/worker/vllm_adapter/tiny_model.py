"""A tiny random Llama model directory, built offline and deterministically.

`write_tiny_model(dest)` writes what any Hugging Face causal-LM directory holds, so vLLM (and
`transformers`) load it by path like a downloaded model:

* `config.json` / `generation_config.json` for `LlamaForCausalLM`;
* `model.safetensors`: random weights drawn with numpy from a fixed seed (the same bytes on every
  machine; no torch needed to build it);
* `tokenizer.json` / `tokenizer_config.json` / `special_tokens_map.json`: a byte-level BPE trained
  with `tokenizers` on a synthetic corpus generated from a fixed seed, with a chat template.

The weights are random, so the output is gibberish: use it to check plumbing, determinism and
P/D-vs-aggregated equality, never text quality. numpy, safetensors and tokenizers are imported
only when a model is built.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
BOS, EOS, PAD = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n# Tools\n\nYou may call one or more functions. The function "
    "signatures are within <tools></tools> XML tags:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "{{ eos_token }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'tool' %}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{% for call in m['tool_calls'] or [] %}<tool_call>\n"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "\n</tool_call>{% endfor %}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Role-tagged turns, each closed by `</s>` (so a trained chat model would learn to stop). With
`tools`, a system turn listing them and calls in the Hermes / Qwen 2 markup
(`<tool_call>{json}</tool_call>`, read by the router's `hermes` tool-call parser); tool results
in `<tool_response>` tags."""

_DTYPES = {"float32": "<f4", "float16": "<f2"}

# Words for the tokenizer's training corpus: common English, serving jargon and code fragments.
_WORDS_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there all one their we can has been if more when will would who so no out
up into do than time some could them other these two may first then only its new over also after
use most where way many well should because each just those how work any through very between what
under such must about before here still same life while since much few own even both being made
long make world year years people system part number must great good little right old back three
request requests token tokens prompt prefill decode worker workers router model models serving batch
cache block blocks memory latency throughput queue schedule scheduler policy placement decision
kernel tensor layer layers head heads attention vector matrix weight weights gradient loss sample
stream streaming client server endpoint pool role roles metric metrics trace traces budget deadline
class def return import from self none true false yield async await lambda raise try except finally
with while for if else elif pass break continue global assert print len range list dict set tuple
int float str bytes bool object type value values key keys item items index error errors config path
file files line lines name names data json yaml http grpc port host address status ready health
user assistant system message messages content chat reply question answer hello thanks please yes
apple river mountain window garden letter music paper light water stone bird cloud winter summer
open close start stop begin end run runs running read write send receive move copy pull push load
"""
_WORDS = tuple(_WORDS_TEXT.split())
_PUNCT = (". ", ", ", "; ", ": ", "? ", "! ", " (", ") ", " = ", " + ", " - ", "\n", "\n\n", " -> ")


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Shape of the tiny model. Defaults: about 5 M parameters, thousands of tokens/s on a CPU."""

    vocab_size: int = 2048
    """Target BPE vocabulary (the trained tokenizer decides the exact size, written to config)."""
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 640
    max_position_embeddings: int = 2048
    seed: int = 0
    dtype: str = "float32"
    """float32 or float16."""
    init_std: float = 0.05
    """Std of the random weights: large enough that greedy output varies with the prompt."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if not 300 <= self.vocab_size <= 65536:
            raise ValueError("vocab_size must be in [300, 65536] (256 bytes + specials + merges)")
        if min(self.num_layers, self.intermediate_size, self.max_position_embeddings) < 1:
            raise ValueError(
                "num_layers, intermediate_size and max_position_embeddings must be >= 1"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def corpus(seed: int, num_lines: int = 4000) -> Iterator[str]:
    """Deterministic pseudo-text: word salad with punctuation, numbers and chat role tags."""
    rng = random.Random(seed)
    for i in range(num_lines):
        words: list[str] = []
        if i % 7 == 0:
            words.append(rng.choice(("<|user|>\n", "<|assistant|>\n", "<|system|>\n")))
        for _ in range(rng.randint(4, 24)):
            w = rng.choice(_WORDS)
            r = rng.random()
            if r < 0.08:
                w = w.capitalize()
            elif r < 0.12:
                w = str(rng.randint(0, 4096))
            words.append(w)
            words.append(rng.choice(_PUNCT) if rng.random() < 0.15 else " ")
        yield "".join(words).strip() + "."


def train_tokenizer(dest: Path, vocab_size: int, seed: int, model_max_length: int) -> int:
    """Train the byte-level BPE tokenizer into `dest`; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus(seed)), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.save(str(dest / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": model_max_length,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(dest / "tokenizer_config.json", tokenizer_config)
    _write_json(
        dest / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    )
    return int(tok.get_vocab_size())


def llama_config(
    spec: TinyModelSpec, vocab_size: int, special_ids: dict[str, int]
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": spec.init_std,
        "torch_dtype": spec.dtype,
        "dtype": spec.dtype,
        "bos_token_id": special_ids[BOS],
        "eos_token_id": special_ids[EOS],
        "pad_token_id": special_ids[PAD],
        "splitserve_tiny_model": asdict(spec),
    }


def weight_shapes(spec: TinyModelSpec, vocab_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of `LlamaForCausalLM` (Hugging Face names), in a fixed order."""
    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab_size, h))]
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (spec.intermediate_size, h)),
            (p + "mlp.up_proj.weight", (spec.intermediate_size, h)),
            (p + "mlp.down_proj.weight", (h, spec.intermediate_size)),
        ]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab_size, h))]
    return shapes


def write_weights(dest: Path, spec: TinyModelSpec, vocab_size: int) -> int:
    """Draw the weights from `spec.seed`, write `model.safetensors`; returns the parameter count."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(spec.seed)
    dtype = np.dtype(_DTYPES[spec.dtype])
    tensors: dict[str, Any] = {}
    for name, shape in weight_shapes(spec, vocab_size):
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=dtype)
        else:
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(spec.init_std)
            tensors[name] = np.ascontiguousarray(w.astype(dtype))
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return sum(int(t.size) for t in tensors.values())


@dataclass(frozen=True, slots=True)
class TinyModelInfo:
    path: Path
    vocab_size: int
    num_parameters: int
    fingerprint: str
    """sha256 over the files written: equal specs give equal fingerprints on any machine."""


def write_tiny_model(dest: Path | str, spec: TinyModelSpec | None = None) -> TinyModelInfo:
    """Build the model directory at `dest` (created if missing; files in it are overwritten)."""
    spec = spec or TinyModelSpec()
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(out, spec.vocab_size, spec.seed, spec.max_position_embeddings)
    tokens = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    special_ids = {t["content"]: int(t["id"]) for t in tokens}
    config = llama_config(spec, vocab, special_ids)
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )
    n_params = write_weights(out, spec, vocab)
    return TinyModelInfo(out, vocab, n_params, fingerprint(out))


MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in MODEL_FILES:
        digest.update(name.encode())
        digest.update((model_dir / name).read_bytes())
    return digest.hexdigest()


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
