"""Length-prefixed frames: the stream link's wire format (`worker.link`, `router.mux`).

A frame is a 4-byte big-endian length and that many bytes of one serialized protobuf message
(`MuxRequest` from the router, `MuxResponse` from the worker): the `Multiplex` stream's messages
without HTTP/2 or gRPC around them.
"""

from __future__ import annotations

from typing import Final

HEADER_BYTES: Final = 4
MAX_FRAME_BYTES: Final = 64 << 20
"""The largest frame either side accepts (a longer length means a broken or foreign peer)."""


class FrameError(ValueError):
    """A frame longer than `MAX_FRAME_BYTES`."""


def frame(payload: bytes) -> bytes:
    """`payload` with its length in front."""
    n = len(payload)
    if n > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {n} bytes is over the limit of {MAX_FRAME_BYTES}")
    return n.to_bytes(HEADER_BYTES, "big") + payload


class FrameSplitter:
    """Whole frames out of bytes that arrive in any pieces (a frame may span reads, a read may
    hold many frames)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the frames `data` completes, in order; the rest is kept.

        Raises:
            FrameError: a frame's length is over `MAX_FRAME_BYTES`.
        """
        buf = self._buf
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data
        out: list[bytes] = []
        pos, end = 0, len(view)
        while end - pos >= HEADER_BYTES:
            n = int.from_bytes(view[pos : pos + HEADER_BYTES], "big")
            if n > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {n} bytes is over the limit of {MAX_FRAME_BYTES}")
            stop = pos + HEADER_BYTES + n
            if stop > end:
                break
            out.append(bytes(view[pos + HEADER_BYTES : stop]))
            pos = stop
        if view is buf:
            del buf[:pos]
        else:
            self._buf = bytearray(view[pos:])
        return out

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)
