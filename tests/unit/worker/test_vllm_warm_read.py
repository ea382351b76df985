"""`nixl.WarmReads`: the pair's first READ, posted at `warm_kv` on vLLM's null block."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.worker.vllm_adapter.nixl import WarmReads


class _Wrapper:
    """The nixl_agent calls `warm_read` makes."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.made: list[tuple[Any, ...]] = []
        self.released: list[str] = []
        self.notifs: list[bytes] = []

    def make_prepped_xfer(
        self, op: str, local: Any, lids: Any, remote: Any, rids: Any, notif_msg: bytes = b""
    ) -> str:
        self.made.append((op, local, list(lids), remote, list(rids)))
        self.notifs.append(notif_msg)
        return "xfer"

    def transfer(self, handle: str) -> str:
        return self.states.pop(0)

    def check_xfer_state(self, handle: str) -> str:
        return self.states.pop(0)

    def release_xfer_handle(self, handle: str) -> None:
        self.released.append(handle)


class _Worker:
    """The NixlConnector worker fields `warm_read` reads (vLLM 0.32 names)."""

    def __init__(self, states: list[str], **over: Any) -> None:
        self.engine_id = "me"
        self.block_size = 16
        # 3 regions of 10 local blocks; the peer has 12 per region.
        self.dst_region_num_blocks = {"me": [10, 10, 10], "peer": [12, 12, 12]}
        self.dst_xfer_side_handles = {"peer": {0: "remote-dlist"}}
        self.src_xfer_handles_by_block_size = {16: "local-dlist"}
        self.src_blocks_data = [object()] * 30
        self._mixed_mem_types = False
        self._has_mamba = False
        self.nixl_wrapper = _Wrapper(states)
        for k, v in over.items():
            setattr(self, k, v)


def test_reads_block_0_of_every_region_without_waiting() -> None:
    worker = _Worker(["PROC", "PROC", "DONE"])
    reads = WarmReads()
    assert reads.start(worker, "peer") == 3
    op, local, lids, remote, rids = worker.nixl_wrapper.made[0]
    assert (op, local, remote) == ("READ", "local-dlist", "remote-dlist")
    assert lids == [0, 10, 20]  # region-major descriptor lists: block 0 of each region
    assert rids == [0, 12, 24]
    # It ends with a notification, as a request's READ does: an empty heartbeat, which vLLM's
    # prefill side reads as extending the leases of the requests it names (none).
    assert worker.nixl_wrapper.notifs == [b"HB:"]
    assert reads.pending == 1  # still in progress: the engine polls it between iterations
    reads.poll()
    assert reads.pending == 1
    assert worker.nixl_wrapper.released == []
    reads.poll()
    assert reads.pending == 0
    assert worker.nixl_wrapper.released == ["xfer"]
    assert reads.failed == []


def test_a_read_done_in_the_post_is_released_at_once() -> None:
    worker = _Worker(["DONE", "DONE"])
    reads = WarmReads()
    reads.start(worker, "peer")
    assert reads.pending == 0
    assert worker.nixl_wrapper.released == ["xfer"]


def test_a_failed_read_is_released_and_named() -> None:
    worker = _Worker(["PROC", "ERR"])
    reads = WarmReads()
    reads.start(worker, "peer")
    reads.poll()
    assert reads.pending == 0
    assert reads.failed == ["peer"]
    assert worker.nixl_wrapper.released == ["xfer"]


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"_has_mamba": True}, "SSM state"),
        ({"_mixed_mem_types": True}, "mixed memory types"),
        ({"src_blocks_data": [object()] * 31}, "not one per block and region"),
        ({"dst_xfer_side_handles": {"peer": {0: "a", 1: "b"}}}, "2 remote ranks"),
        ({"src_xfer_handles_by_block_size": {}}, "no local descriptor list"),
    ],
)
def test_an_unsupported_layout_is_refused_by_name(over: dict[str, Any], why: str) -> None:
    worker = _Worker(["DONE"], **over)
    with pytest.raises(ValueError, match=why):
        WarmReads().start(worker, "peer")
    assert worker.nixl_wrapper.made == []


def test_the_warm_up_read_is_on_unless_the_env_says_0() -> None:
    from splitserve.worker.vllm_adapter.engine import WARM_READ_ENV, warm_read_on

    assert warm_read_on({}) is True
    assert warm_read_on({WARM_READ_ENV: ""}) is True
    assert warm_read_on({WARM_READ_ENV: "1"}) is True
    assert warm_read_on({WARM_READ_ENV: "0"}) is False
    with pytest.raises(ValueError, match="SPLITSERVE_KV_WARM_READ must be 0 or 1, not 'off'"):
        warm_read_on({WARM_READ_ENV: "off"})


def test_early_decodes_are_prepared_only_when_the_env_says_so() -> None:
    from splitserve.worker.vllm_adapter.engine import PREPARE_DECODE_ENV, prepare_decode_mode

    assert prepare_decode_mode({}) == ""
    assert prepare_decode_mode({PREPARE_DECODE_ENV: ""}) == ""
    assert prepare_decode_mode({PREPARE_DECODE_ENV: "0"}) == ""
    assert prepare_decode_mode({PREPARE_DECODE_ENV: "1"}) == "1"
    assert prepare_decode_mode({PREPARE_DECODE_ENV: "alternate"}) == "alternate"
    with pytest.raises(
        ValueError, match="SPLITSERVE_KV_PREPARE_DECODE must be 0, 1 or alternate, not 'no'"
    ):
        prepare_decode_mode({PREPARE_DECODE_ENV: "no"})


def test_the_held_kv_poll_interval_is_5_ms_unless_the_env_says_otherwise() -> None:
    from splitserve.worker.vllm_adapter.engine import HELD_POLL_ENV, held_poll_s

    assert held_poll_s({}) == 0.005
    assert held_poll_s({HELD_POLL_ENV: "1"}) == 0.001
    assert held_poll_s({HELD_POLL_ENV: "0.5"}) == 0.0005
    for bad in ("0", "1000", "fast", "nan"):
        with pytest.raises(ValueError, match="SPLITSERVE_KV_HELD_POLL_MS must be a number of ms"):
            held_poll_s({HELD_POLL_ENV: bad})
