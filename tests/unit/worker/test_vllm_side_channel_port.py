"""The NIXL side-channel port picked for `nixl_side_channel_port=0` lies below the kernel's
ephemeral range, so no `bind(0)` in the same process can take it before vLLM binds it."""

from __future__ import annotations

import socket
from pathlib import Path

from splitserve.worker.vllm_adapter.engine import _free_port


def _range_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return str(path)


def test_the_port_is_below_the_ephemeral_range_and_free(tmp_path: Path) -> None:
    for _ in range(20):
        port = _free_port("127.0.0.1", _range_file(tmp_path, "32768\t60999\n"))
        assert 12_768 <= port < 32_768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_range_starting_too_low_falls_back_to_bind_zero(tmp_path: Path) -> None:
    port = _free_port("127.0.0.1", _range_file(tmp_path, "1024 65000"))
    assert 1024 <= port <= 65535


def test_an_unreadable_range_file_means_linux_default(tmp_path: Path) -> None:
    port = _free_port("127.0.0.1", str(tmp_path / "absent"))
    assert 12_768 <= port < 32_768
