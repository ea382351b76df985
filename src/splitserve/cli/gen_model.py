"""`splitserve gen tiny-model DIR`: a tiny random Llama model directory for local runs and tests."""

from __future__ import annotations

import json
from pathlib import Path

import click

_SIZE = click.IntRange(min=1)  # a negative size wrote half the model, then a numpy traceback


@click.command("tiny-model")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--vocab-size",
    type=click.IntRange(300, 65536),
    default=2048,
    show_default=True,
    help="Target BPE vocabulary (256 bytes + specials + merges).",
)
@click.option("--hidden-size", type=_SIZE, default=256, show_default=True)
@click.option("--num-layers", type=_SIZE, default=4, show_default=True)
@click.option("--num-heads", type=_SIZE, default=4, show_default=True)
@click.option(
    "--num-kv-heads", type=_SIZE, default=4, show_default=True, help="< num-heads gives GQA."
)
@click.option("--intermediate-size", type=_SIZE, default=640, show_default=True)
@click.option("--max-position-embeddings", type=_SIZE, default=2048, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seed of the weights and the corpus.")
@click.option(
    "--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True
)
@click.option("--force", is_flag=True, help="Write into DEST even if it is not empty.")
def tiny_model(
    dest: Path,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
    dtype: str,
    force: bool,
) -> None:
    """Write a random tiny Llama model (config.json, model.safetensors, BPE tokenizer) to DEST.

    The same options give byte-identical files on any machine. The weights are random: the text
    it generates is gibberish, which is enough to exercise serving end to end (vLLM loads DEST
    like any Hugging Face model directory).
    """
    from splitserve.worker.vllm_adapter.tiny_model import TinyModelSpec, write_tiny_model

    if dest.exists() and any(dest.iterdir()) and not force:
        raise click.ClickException(f"{dest} is not empty (use --force to overwrite)")
    try:
        spec = TinyModelSpec(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            seed=seed,
            dtype=dtype,
        )
    except ValueError as e:  # the sizes disagree: name the flags of the fields it names
        named = [
            f"--{field.replace('_', '-')}"
            for field in ("hidden_size", "num_heads", "num_kv_heads", "dtype")
            if field in str(e)
        ]
        raise click.BadParameter(str(e), param_hint=" / ".join(named) or None) from e
    info = write_tiny_model(dest, spec)
    click.echo(
        json.dumps(
            {
                "path": str(info.path),
                "vocab_size": info.vocab_size,
                "num_parameters": info.num_parameters,
                "fingerprint": info.fingerprint,
            }
        )
    )
