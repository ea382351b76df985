"""`FileDiscovery`: the router follows a workers file (`splitserve up --autoscale`) and
acknowledges each version it applied; a bad file is refused (logged) and changes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from splitserve.core.roles import Role
from splitserve.router.discovery import (
    EndpointState,
    FileDiscovery,
    applied_path,
    endpoints_from_file,
    workers_file_text,
)
from tests.unit.router.test_discovery import FakePool


def ep(address: str, role: Role = Role.PREFILL, fenced: bool = False) -> EndpointState:
    return EndpointState(address, role, True, fenced, address)


def write(path: Path, *eps: EndpointState) -> str:
    text = workers_file_text(eps)
    path.write_text(text)
    return text


def acked(path: Path) -> str:
    return Path(applied_path(str(path))).read_text()


def test_round_trip() -> None:
    eps = [ep("127.0.0.1:2", Role.DECODE, fenced=True), ep("127.0.0.1:1")]
    assert endpoints_from_file(workers_file_text(eps)) == {e.address: e for e in eps}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"workers": []}',
        '{"version": 2, "workers": []}',
        '{"version": 1, "workers": [], "extra": 1}',
        '{"version": 1, "workers": [{"address": "a:1", "role": "prefill"}]}',
        '{"version": 1, "workers": [{"address": "a:1", "role": "bogus", "fenced": false}]}',
        '{"version": 1, "workers": [{"address": "", "role": "decode", "fenced": false}]}',
        '{"version": 1, "workers": [{"address": "a:1", "role": "decode", "fenced": "no"}]}',
    ],
)
def test_bad_files_are_refused(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        endpoints_from_file(text)


def test_poll_adds_fences_removes_and_acknowledges(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "workers.json"
        pool = FakePool()
        d = FileDiscovery(pool, str(path))
        await d.poll()  # no file yet: nothing
        assert pool.calls == []
        text = write(path, ep("a:1"), ep("b:2", Role.DECODE))
        await d.poll()
        assert pool.fenced == {"a:1": False, "b:2": False}
        assert acked(path) == text
        text = write(path, ep("a:1", fenced=True), ep("b:2", Role.DECODE))
        await d.poll()
        assert pool.fenced == {"a:1": True, "b:2": False}
        assert acked(path) == text
        calls = len(pool.calls)
        await d.poll()  # unchanged: nothing done again
        assert len(pool.calls) == calls
        text = write(path, ep("b:2", Role.DECODE))
        await d.poll()
        assert pool.fenced == {"b:2": False}
        assert ("remove", "a:1") in pool.calls
        path.write_text("{broken")
        await d.poll()  # refused: the pool keeps what it had, the acknowledgement too
        assert pool.fenced == {"b:2": False}
        assert acked(path) == text

    asyncio.run(main())


def test_started_discovery_follows_the_file(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "workers.json"
        write(path, ep("a:1"))
        pool = FakePool()
        d = FileDiscovery(pool, str(path), poll_s=0.01)
        await d.start()  # applies the file before it returns
        assert pool.fenced == {"a:1": False}
        write(path, ep("a:1"), ep("c:3", Role.DECODE))
        async with asyncio.timeout(10):
            while "c:3" not in pool.fenced:  # noqa: ASYNC110 - the fake pool has no event
                await asyncio.sleep(0.01)
        await d.stop()

    asyncio.run(main())


def test_a_missing_file_is_warned_about_at_start_then_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped `--workers-file` served with zero workers and said nothing; the file may be
    created later by design (docs/autoscaling.md), so the router starts and says so."""

    async def main() -> None:
        path = tmp_path / "workers.json"
        pool = FakePool()
        d = FileDiscovery(pool, str(path), poll_s=3600)
        with caplog.at_level("WARNING", logger="splitserve.router.discovery"):
            await d.start()
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1
        assert str(path) in warnings[0]
        assert "--workers-file" in warnings[0]
        assert "does not exist" in warnings[0]
        write(path, ep("a:1"))
        await d.poll()  # created later: followed
        assert pool.fenced == {"a:1": False}
        await d.stop()

    asyncio.run(main())
