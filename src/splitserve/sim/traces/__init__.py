"""The Azure LLM inference traces (2023) shipped with the package; see NOTICE beside them.

`TRACES_DIR` is the one place their location is computed (bench, the Splitwise reproduction and
`splitserve sim bench` all read it).
"""

from __future__ import annotations

from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parent


def bundled_trace(kind: str) -> Path:
    """The bundled Azure 2023 trace of `kind`: "conv" or "code"."""
    if kind not in ("conv", "code"):
        raise ValueError(f"unknown bundled trace {kind!r}; valid: code, conv")
    return TRACES_DIR / f"azure_llm_2023_{kind}.csv"
