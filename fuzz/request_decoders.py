"""Fuzz the client protocol's decoders, differentially: the C codec (``_codec.c``) and the
Python reference (``common/format/protocol.py``) get the same frames and must give the same
Request or Response, or the same refusal (code, field, reason). No other exception may
escape, and an accepted message's strings bound for a record hold no property separator.

Input: a flags byte (which limits; request or response), then length-prefixed frames.
Run: ``python fuzz/request_decoders.py -max_total_time=600``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgpack

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, pack_frames, run, tolerated

with instrumented(__name__):
    from common.format import boundary, protocol
    from common.format.protocol import Limits, ProtocolError, RequestCode

NAME = "request_decoders"
LIMITS = (
    Limits(),
    Limits(max_frame_bytes=64 * 1024, max_body_bytes=4096, max_batch_count=16,
           max_topic_length=40),
    Limits(max_frame_bytes=512, max_body_bytes=64, max_batch_count=2, max_topic_length=3),
    Limits(max_frame_bytes=1 << 20, max_body_bytes=1 << 16, max_batch_count=64),
)
native: Any = protocol._native  # None: not built (or PURE_PYTHON_REPLOG): Python alone


def _outcome(decode: Any, frames: list[bytes], limits: Limits) -> Any:
    """A decode's result, comparable with ==: a refusal's parts, or the message (its fields
    packed: a NaN is not equal to itself)."""
    try:
        got = decode(frames, limits)
    except ProtocolError as e:
        assert isinstance(e.field, str) and e.reason, (e.field, e.reason)  # "" may be a key
        return ("refused", e.field, str(e), e.code, e.opaque)
    return (type(got).__name__, got.code, got.opaque, msgpack.packb(got.fields),
            *got[3:])


def _no_separators(req: Any) -> None:
    """What a record will carry holds no property separator (an injected property)."""
    texts: list[str] = []
    if req.code == RequestCode.SEND:
        texts += [req.fields.get("tags") or "", req.fields.get("keys") or ""]
        for k, v in (req.fields.get("properties") or {}).items():
            texts += [k, v]
    if req.code == RequestCode.SEND_BATCH:
        for tags, keys, props, *_ in req.fields.get("meta") or ():
            texts += [tags or "", keys or ""]
            for k, v in props.items():
                texts += [k, v]
    bad = [t for t in texts if boundary.text_refusal(t)]
    if bad and not tolerated("separators"):
        raise AssertionError(f"accepted a string with a property separator: {bad[0]!r}")


def check_request(frames: list[bytes], limits: Limits) -> None:
    ref = _outcome(protocol._decode_request_py, frames, limits)
    assert _outcome(protocol.decode_request, frames, limits) == ref, frames
    if native is not None:
        out = native.decode_request(frames, limits)
        if type(out) is protocol.Request:  # taken in C: the reference accepts it the same
            assert ref[0] == "Request", (frames, ref)
            assert list(out.fields) == list(protocol._decode_request_py(frames, limits).fields)
        elif out is not None:  # left to Python with the header: msgpack's own
            kwargs = protocol._unpack_kwargs(limits.max_batch_count)
            assert msgpack.packb(out) == msgpack.packb(
                msgpack.unpackb(frames[0], raw=False, **kwargs))
    if ref[0] == "Request":
        _no_separators(protocol._decode_request_py(frames, limits))


def check_response(frames: list[bytes], limits: Limits) -> None:
    limits = limits.for_responses()
    ref = _outcome(protocol._decode_response_py, frames, limits)
    assert _outcome(protocol.decode_response, frames, limits) == ref, frames


def one_input(data: bytes) -> None:
    r = Reader(data)
    flags = r.byte()
    frames = r.frames(most=80)
    limits = LIMITS[flags & 3]
    if flags & 4:
        check_response(frames, limits)
    else:
        check_request(frames, limits)


def seeds() -> list[bytes]:
    """Valid requests of every code and answers, and the protocol tests' nasty frames."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "property"))
    import test_protocol_fuzz as t

    out = []
    for code in protocol.SCHEMAS:
        frames = [t._header(code, t._valid_fields(code)), *t._bodies(code)]
        out.append(bytes([0]) + pack_frames(frames))
        out.append(bytes([1]) + pack_frames(frames))
    send = protocol.encode_request(RequestCode.SEND, 7, {
        "topic": "orders", "queueId": 1, "tags": "TagA", "keys": "k1 k2",
        "properties": {"color": "blue", "UNIQ_KEY": "0A0B"}, "flag": 3,
        "bornTimestamp": 1_700_000_000_000}, [b"hello"])
    out.append(bytes([1]) + pack_frames(list(send)))
    batch = protocol.encode_request(RequestCode.SEND_BATCH, 8, {
        "topic": "orders", "queueId": 0, "sizes": [2, 3],
        "meta": [["a", "k", {"x": "y"}, 0], None]}, [b"ab" + b"cde"])
    out.append(bytes([1]) + pack_frames(list(batch)))
    for i, (label, frames) in enumerate(t.fixed_corpus()):
        if "=" in label and i % 4:  # a wrong-typed field: a sample of them is enough
            continue
        if sum(map(len, frames)) < 4096 and len(frames) < 40:
            out.append(bytes([1]) + pack_frames(frames))
    ok = protocol.encode_response(0, 5, "", {"msgId": "AB", "queueOffset": 3})
    out.append(bytes([4]) + pack_frames(list(ok) + [b"record"]))
    out.append(bytes([5]) + pack_frames([msgpack.packb([protocol.PROTOCOL_VERSION, 1, -1,
                                                        "remark", {"field": "topic"}])]))
    return out


if __name__ == "__main__":
    run(NAME, one_input)
