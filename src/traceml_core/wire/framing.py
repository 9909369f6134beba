"""Cutting a received byte stream into frames: one loop for the aggregator and the node relay.

Both read with ``recv_into`` into one reused scratch buffer (``sock.recv(256 KiB)`` would allocate
256 KiB per call) and decode whole frames straight from it; only a frame that spans two reads is
copied into the connection's own ``buf``. This is the ingest hot path: one call per read, one
callback per frame, nothing allocated per frame but the decoded message.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from msgpack import unpackb as _unpackb

from .protocol import HEADER

_unpack_header = HEADER.unpack_from


class Buffered(Protocol):
    #: the start of a frame that did not fit in the last read (empty between frames)
    buf: bytearray


#: ``on_frame(conn, msg, data, off, end)``: handle one decoded frame (``data[off:end]`` is its raw
#: bytes, header included, for a relay that forwards them untouched). Returns the length limit for
#: the next frame, or 0 to stop at once (the callback closed the connection).
OnFrame = Callable[[Any, dict[str, Any], Any, int, int], int]


def split_frames(conn: Buffered, view: memoryview, got: int, limit: int, on_frame: OnFrame) -> Optional[str]:
    """Feed ``view[:got]``, just received on ``conn``, through ``on_frame``; keep a trailing partial
    frame in ``conn.buf``. Returns None, or why the stream is malformed (the caller closes it): a
    length prefix over ``limit``, a body msgpack cannot decode, or a frame that is not a map.
    When ``on_frame`` stops the loop, ``conn.buf`` is left as it was (it may be gone)."""
    buf = conn.buf
    if buf:
        buf += view[:got]
        data: Any = buf
        size = len(buf)
    else:
        data = view
        size = got
    off = 0
    while size - off >= 4:
        (length,) = _unpack_header(data, off)
        if length > limit:
            return f"length prefix {length} exceeds the limit of {limit}"
        end = off + 4 + length
        if end > size:
            break
        try:
            msg = _unpackb(data[off + 4:end], raw=False, strict_map_key=False)
        except Exception as exc:
            return f"undecodable frame ({type(exc).__name__})"
        if type(msg) is not dict:
            return "frame is not a map"
        limit = on_frame(conn, msg, data, off, end)
        if not limit:
            return None
        off = end
    if data is buf:
        if off:
            del buf[:off]
    elif off < size:
        buf += view[off:size]
    return None
