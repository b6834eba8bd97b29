"""Compressed bodies (SYSFLAG COMPRESSED, RocketMQ's compressMsgBodyOverHowmuch): the codec, the
wire fields, the producer's choice, the store's record and the client's decoding."""

from __future__ import annotations

import base64
import random
import zlib
from pathlib import Path

import pytest
from helpers.stores import make_store

from common.client import Producer, pull_result
from common.core.errors import CorruptMessageError, PutStatus, ResponseCode
from common.core.message import (
    SYSFLAG_COMPRESSED,
    Message,
    MessageExt,
    compress_body,
    encode_properties,
    inflate_body,
)
from common.format import record
from common.format.protocol import (
    Limits,
    ProtocolError,
    RequestCode,
    Response,
    decode_record,
    decode_request,
    encode_request,
)
from common.store.schedule import to_real_message, to_schedule_message
from master.send_back import plan

pytestmark = pytest.mark.unit

LIMITS = Limits(max_frame_bytes=1024 * 1024, max_body_bytes=64 * 1024, max_batch_count=16)

# What RocketMQ 4.x's UtilAll.compress(src, 5) (java.util.zip.Deflater(5) through a
# DeflaterOutputStream) made of JAVA_SOURCE on OpenJDK 17, printed as hex by a Java program.
JAVA_SOURCE = (b"order-42 shipped;" * 400)[:5000]
JAVA_DEFLATED = bytes.fromhex(
    "785eedc8b10d00101000c0552ca0119d7548a85ed83fb184f2aebc387d9c5c4bba73ed3d7a0b2184104208"
    "218410420821c4ef78686bdae6"
)


def test_bodies_deflate_as_javas_deflater_does_and_inflate_back() -> None:
    assert compress_body(JAVA_SOURCE, 5) == JAVA_DEFLATED
    assert inflate_body(JAVA_DEFLATED) == JAVA_SOURCE


def test_an_incompressible_body_is_not_compressed() -> None:
    noise = random.Random(7).randbytes(8192)
    assert compress_body(noise) is None
    text = b"".join(b"order %d shipped to %d at %d;" % (i, i * 7919 % 10007, i * i % 99991)
                    for i in range(3000))
    gzipped = zlib.compress(text, 9)  # a body its producer compressed already
    assert compress_body(gzipped) is None


def test_the_entropy_probe_spares_random_bodies_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bytes are not even tried; text, base64 and structured binary are."""
    tried = []
    real = zlib.compress
    monkeypatch.setattr(zlib, "compress", lambda data, level: tried.append(1) or real(data, level))
    assert compress_body(random.Random(8).randbytes(8192)) is None and not tried
    text_b64 = base64.b64encode(JAVA_SOURCE * 2)
    binary = b"".join(i.to_bytes(4, "big") + b"\x00\x01status\x02" for i in range(600))
    cjk = "訂單已發貨至倉庫七號，預計明日送達。".encode() * 100
    for body in (JAVA_SOURCE, text_b64, binary, cjk):
        assert inflate_body(compress_body(body) or b"") == body
    assert len(tried) == 4


def test_inflating_is_bounded_and_refuses_bad_streams() -> None:
    bomb = zlib.compress(b"\0" * (8 * 1024 * 1024), 9)  # ~8 KiB that inflate to 8 MiB
    assert len(bomb) < 16 * 1024
    with pytest.raises(ValueError, match="past 1048576 bytes"):
        inflate_body(bomb, 1024 * 1024)
    assert len(inflate_body(bomb, 8 * 1024 * 1024)) == 8 * 1024 * 1024
    with pytest.raises(ValueError, match="truncated"):
        inflate_body(JAVA_DEFLATED[:-6])
    with pytest.raises(ValueError, match="does not inflate"):
        inflate_body(b"this is not zlib at all")
    assert inflate_body(JAVA_DEFLATED, sys_flag=SYSFLAG_COMPRESSED | 3 << 8) == JAVA_SOURCE
    for kind, name in ((1, "LZ4"), (2, "ZSTD"), (5, "type 5")):
        with pytest.raises(ValueError, match=f"compressed with {name}"):
            inflate_body(JAVA_DEFLATED, sys_flag=SYSFLAG_COMPRESSED | kind << 8)


# ---- the wire ---------------------------------------------------------------------------------


def test_send_carries_the_compressed_and_prepared_flags_and_nothing_else() -> None:
    fields = {"topic": "orders", "queueId": 0, "sysFlag": SYSFLAG_COMPRESSED}
    req = decode_request(encode_request(RequestCode.SEND, 1, fields, [b"x"]), LIMITS)
    assert req.fields["sysFlag"] == SYSFLAG_COMPRESSED
    plain = decode_request(encode_request(RequestCode.SEND, 1, {"topic": "o", "queueId": 0},
                                          [b"x"]), LIMITS)
    assert plain.fields["sysFlag"] == 0
    prepared = decode_request(encode_request(RequestCode.SEND, 1, {**fields, "sysFlag": 0x4},
                                             [b"x"]), LIMITS)
    assert prepared.fields["sysFlag"] == 0x4  # a half message's (the broker checks TRAN_MSG)
    for bad in (0x8, 0xC, 0x80, -1, "1", 1.0):  # commit, rollback, batch, garbage
        with pytest.raises(ProtocolError) as e:
            decode_request(encode_request(RequestCode.SEND, 1, {**fields, "sysFlag": bad}, [b"x"]),
                           LIMITS)
        assert e.value.field == "sysFlag" and e.value.code == ResponseCode.BAD_REQUEST


def test_batch_meta_takes_an_optional_fifth_sysflag() -> None:
    meta = [["t", None, None, 0, SYSFLAG_COMPRESSED], [None, None, None, 0], None]
    frames = encode_request(RequestCode.SEND_BATCH, 1,
                            {"topic": "o", "queueId": 0, "meta": meta}, [b"a", b"b", b"c"])
    got = decode_request(frames, LIMITS).fields["meta"]
    assert [m[4] for m in got] == [SYSFLAG_COMPRESSED, 0, 0]
    for entry in (["t", None, None, 0, 0x4], ["t", None, None, 0, 1, 9]):
        frames = encode_request(RequestCode.SEND_BATCH, 1,
                                {"topic": "o", "queueId": 0, "meta": [entry]}, [b"a"])
        with pytest.raises(ProtocolError) as e:
            decode_request(frames, LIMITS)
        assert e.value.field.startswith("meta[0]")


def stored_record(body: bytes, sys_flag: int, queue_offset: int = 5) -> bytes:
    return bytes(record.encode(b"orders", body, encode_properties({"TAGS": "A"}), 0, queue_offset,
                               4096 + queue_offset, sys_flag=sys_flag))


def test_a_compressed_record_decodes_to_the_body_its_producer_sent() -> None:
    raw = stored_record(JAVA_DEFLATED, SYSFLAG_COMPRESSED)
    msg = decode_record(raw)
    assert msg.body == JAVA_SOURCE and msg.tags == "A"
    assert msg.sys_flag == SYSFLAG_COMPRESSED  # the stored record's fields stay as stored
    assert msg.body_crc == zlib.crc32(JAVA_DEFLATED) & 0x7FFFFFFF and msg.store_size == len(raw)
    with pytest.raises(ProtocolError, match="past 100 bytes"):
        decode_record(raw, max_inflated_bytes=100)
    assert decode_record(stored_record(JAVA_DEFLATED, 0)).body == JAVA_DEFLATED  # flag unset
    with pytest.raises(ProtocolError, match="compressed with ZSTD"):  # RocketMQ 5's other codecs
        decode_record(stored_record(JAVA_DEFLATED, SYSFLAG_COMPRESSED | 2 << 8))


def test_a_compressed_body_that_does_not_inflate_is_a_corrupt_message() -> None:
    """Its CRC is right (it is over the stored bytes), so only inflating finds it: the pull
    ends before it, and a pull that starts on it names it, as for a CRC failure."""
    good = stored_record(JAVA_DEFLATED, SYSFLAG_COMPRESSED, 5)
    bad = stored_record(b"\x78\x5e garbage", SYSFLAG_COMPRESSED, 6)
    with pytest.raises(ProtocolError) as e:
        decode_record(bad)
    assert e.value.field == "record.body"
    fields = {"nextBeginOffset": 7, "minOffset": 0, "maxOffset": 7}
    found = pull_result(Response(ResponseCode.SUCCESS, 1, "", fields, [good, bad]))
    assert [m.body for m in found.messages] == [JAVA_SOURCE] and found.next_begin_offset == 6
    with pytest.raises(CorruptMessageError) as ce:
        pull_result(Response(ResponseCode.SUCCESS, 1, "", fields, [bad]))
    assert ce.value.queue_offset == 6 and ce.value.commit_log_offset == 4096 + 6


# ---- the producer's choice -------------------------------------------------------------------


@pytest.fixture
def producer() -> Producer:
    p = Producer("127.0.0.1:1", compress_over_bytes=4096)
    yield p
    p.close()


def test_the_producer_deflates_bodies_over_the_threshold_only(producer: Producer) -> None:
    small = Message("o", b"a" * 4095)
    assert producer._deflate(small) == (small.body, 0)
    big = Message("o", JAVA_SOURCE, tags="T")
    body, sys_flag = producer._deflate(big)
    assert body == JAVA_DEFLATED and sys_flag == SYSFLAG_COMPRESSED
    assert big.body == JAVA_SOURCE and big.sys_flag == 0  # the caller's message is untouched
    noise = random.Random(7).randbytes(8192)
    assert producer._deflate(Message("o", noise)) == (noise, 0)
    mine = Message("o", JAVA_DEFLATED * 100, sys_flag=SYSFLAG_COMPRESSED)  # deflated by caller
    assert producer._deflate(mine) == (mine.body, SYSFLAG_COMPRESSED)


def test_compression_can_be_turned_off_and_is_checked() -> None:
    with Producer("127.0.0.1:1", compress_over_bytes=None) as p:
        assert p._deflate(Message("o", JAVA_SOURCE)) == (JAVA_SOURCE, 0)
    with pytest.raises(ValueError, match="compress_level"):
        Producer("127.0.0.1:1", compress_level=10)
    with pytest.raises(ValueError, match="compress_over_bytes"):
        Producer("127.0.0.1:1", compress_over_bytes=0)


# ---- the store keeps the flag ----------------------------------------------------------------


def test_the_store_writes_the_flag_and_the_crc_of_the_stored_bytes(tmp_path: Path) -> None:
    store = make_store(tmp_path, mappedFileSizeCommitLog=64 * 1024)
    try:
        one = store.put(Message("orders", JAVA_DEFLATED, sys_flag=SYSFLAG_COMPRESSED), 0)
        batch = store.put_batch("orders", 0, [
            Message("orders", b"plain"),
            Message("orders", JAVA_DEFLATED, tags="T", sys_flag=SYSFLAG_COMPRESSED),
        ])
        assert one.status is PutStatus.PUT_OK and batch.status is PutStatus.PUT_OK
        offsets = [one.phy_offset, *batch.record_offsets]
        got = [store.find_message(phy) for phy in offsets]
        assert [m.sys_flag for m in got] == [SYSFLAG_COMPRESSED, 0, SYSFLAG_COMPRESSED]
        assert got[0].body == JAVA_DEFLATED  # the store never inflates
        assert got[0].body_crc == zlib.crc32(JAVA_DEFLATED) & 0x7FFFFFFF
        raw = store.commit_log.read(offsets[2], got[2].store_size)
        assert decode_record(bytes(raw)).body == JAVA_SOURCE
    finally:
        store.shutdown()


def stored(sys_flag: int) -> MessageExt:
    return MessageExt(topic="orders", queue_id=0, queue_offset=3, commit_log_offset=4096,
                      store_size=300, body=JAVA_DEFLATED, properties={"TAGS": "A"},
                      sys_flag=sys_flag, msg_id="0A00000900002A9F0000000000001000")


def test_copies_the_broker_makes_stay_compressed() -> None:
    """A retry copy (send-back) and a delayed message's two records keep the deflated body with
    its flag, as RocketMQ copies sysFlag; they are never inflated on the broker."""
    back = plan(stored(SYSFLAG_COMPRESSED), "billing", "orders", 0, 16, 18).message
    assert back.body == JAVA_DEFLATED and back.sys_flag == SYSFLAG_COMPRESSED
    held, _ = to_schedule_message(
        Message("orders", JAVA_DEFLATED, delay_level=2, sys_flag=SYSFLAG_COMPRESSED), 1, 18)
    assert held.sys_flag == SYSFLAG_COMPRESSED
    ext = stored(SYSFLAG_COMPRESSED)
    ext.properties = {**ext.properties, "REAL_TOPIC": "orders", "REAL_QID": "1"}
    real, queue_id = to_real_message(ext)
    assert real.sys_flag == SYSFLAG_COMPRESSED and real.body == JAVA_DEFLATED and queue_id == 1


def test_the_spark_sinks_compress_over_bytes_option() -> None:
    """(replog send --compress-over is tested through the CLI in test_broker_roundtrip.)"""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from common.pipeline.sink import SinkOptions

    schema = StructType([StructField("body", BinaryType())])
    opts = {"servers": "127.0.0.1:1", "topic": "t"}
    assert SinkOptions.parse(opts, schema).compress_over_bytes == 4096
    assert SinkOptions.parse({**opts, "compressOverBytes": "0"}, schema).compress_over_bytes is None
    assert SinkOptions.parse({**opts, "compressOverBytes": "100"}, schema).compress_over_bytes == 100
    with pytest.raises(ValueError, match="compressOverBytes"):
        SinkOptions.parse({**opts, "compressOverBytes": "-1"}, schema)
