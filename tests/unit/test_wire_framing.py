"""The one frame-cutting loop the aggregator and the relay share (wire/framing.py): frames split
across reads at any byte arrive whole and in order, and each kind of broken stream is named."""

from __future__ import annotations

import struct

import msgpack
import pytest

from traceml_core.wire.framing import split_frames
from traceml_core.wire.protocol import encode


class Conn:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.got: list[dict] = []
        self.raw: list[bytes] = []

    def on_frame(self, conn, msg, data, off, end) -> int:
        assert conn is self
        self.got.append(msg)
        self.raw.append(bytes(data[off:end]))
        return 1 << 20


FRAMES = [{"t": "steps", "rank": r, "rows": list(range(r * 7))} for r in range(12)]
STREAM = b"".join(encode(f) for f in FRAMES)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 13, 64, 1000, len(STREAM)])
def test_frames_cut_anywhere_arrive_whole_and_in_order(chunk):
    c, scratch = Conn(), bytearray(len(STREAM))
    view = memoryview(scratch)
    for i in range(0, len(STREAM), chunk):
        piece = STREAM[i:i + chunk]
        scratch[:len(piece)] = piece
        assert split_frames(c, view, len(piece), 1 << 20, c.on_frame) is None
    assert c.got == FRAMES
    assert c.raw == [encode(f) for f in FRAMES], "the raw bytes a relay forwards are the frame's own"
    assert not c.buf, "nothing is left over after the last whole frame"


def test_the_callback_can_stop_the_loop_and_lower_the_limit():
    c, calls = Conn(), []

    def hello_then_small(conn, msg, data, off, end):
        calls.append(msg)
        return 10 if len(calls) == 1 else 0

    two = encode({"t": "hello"}) + encode({"t": "steps", "rows": list(range(50))})
    why = split_frames(c, memoryview(bytearray(two)), len(two), 1 << 20, hello_then_small)
    assert why is not None and why.startswith("length prefix") and "limit of 10" in why
    assert split_frames(Conn(), memoryview(bytearray(two)), len(two), 1 << 20, lambda *a: 0) is None


@pytest.mark.parametrize("data, needle", [
    (struct.pack(">I", 5000) + b"x", "length prefix 5000 exceeds the limit of 4096"),
    (struct.pack(">I", 1) + b"\xc1", "undecodable frame"),
    (struct.pack(">I", 2) + msgpack.packb([1]), "frame is not a map"),
])
def test_broken_streams_are_named(data, needle):
    why = split_frames(Conn(), memoryview(bytearray(data)), len(data), 4096, Conn().on_frame)
    assert why is not None and needle in why
