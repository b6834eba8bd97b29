"""Where a put's CPU goes, layer by layer: the transport, our codec, the store write, the rest.

    .venv/bin/python bench/put_layers.py [--count 4000] [--rounds 2] [--only single batch]

Issue 24 asks a sync send for 0.9x a bare DEALER/ROUTER echo and a ``send_batch`` x64 for 0.6x
a packed echo. This script builds the broker's answer up from the echo, one layer at a time,
each a server process of its own answering the real wire format, one request in flight:

| server  | does per request                                                                  |
|---------|-----------------------------------------------------------------------------------|
| echo    | ``recv_multipart`` and ``send_multipart`` back (``bench/broker_put.py``'s echo)     |
| codec   | + ``decode_request`` and ``encode_response`` of the real protocol, nothing stored   |
| store   | + ``CommitLog.put`` / ``put_batch`` of the real store, the master's reply fields    |
| broker  | the broker itself (ASYNC_MASTER, ASYNC_FLUSH): request server, role, MessageStore   |
|         | with reput, stats, the participants' loop                                         |

The client is a bare DEALER that sends what ``Producer`` sends (``encode_request``, one body or
the packed bodies) and decodes the answer (``decode_response``); a last row is the broker with
the real ``Producer``, as it comes (it spins for an answer expected within ``spin_us``, 300 us)
and with ``spin_us=0`` (its CPU then is work, not waiting). Printed per row: wall rate, CPU microseconds per message of the client
(this process) and of the server (``/proc``, every thread), and the rate against the echo's of
the same round. The difference between two rows is what that layer costs; the ``store`` row is
the most a reshaped request path around the same codec and store could reach.

The SYNC cases (``sync``: one 1 KiB body per request, ``sync-batch``: 64 of them, as issue 24's
SYNC rows) do the same for a put that a slave must acknowledge, three processes each:

| row     | master and slave                                                                   |
|---------|------------------------------------------------------------------------------------|
| relay   | ``bench/replication.py``'s bare 4-hop relay: the request's bytes to the slave, its  |
|         | ack answers the client; no work                                                    |
| store   | the master decodes, ``CommitLog.put``s, sends the record's bytes in a real HA DATA  |
|         | frame; the slave decodes it, ``append_replicated``s it, acks with a real HA ACK;   |
|         | the master answers with the real reply                                             |
| broker  | a SYNC_MASTER and its slave                                                        |
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _support
import zmq
from cpu_per_message import Meter, end, report, spawn
from replication import Broker, _relay_master, _relay_slave, group

from common.client import Producer
from common.client.results import pack_bodies
from common.client.transport import CLIENT_LIMITS, DEFAULT_SPIN_US
from common.core.errors import SendStatus
from common.core.message import Message
from common.format.protocol import (
    Limits,
    RequestCode,
    ResponseCode,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from common.ha import protocol as ha_protocol

CASES = {"single": (1, 128), "batch": (64, 128),  # bodies per request, body bytes
         "sync": (1, 1024), "sync-batch": (64, 1024)}
LAYERS = ("echo", "codec", "store")
SYNC_LAYERS = ("relay", "store")
HA_LIMITS = ha_protocol.Limits(max_data_bytes=1 << 20)
SEGMENT = 1 << 30


def _server(layer: str, port: int, root: str,
            ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """One layer's server (see the module docstring); runs until killed."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    limits = Limits()
    log = None
    if layer == "store":
        from common.store.commit_log import CommitLog
        from master.role import store_host_text

        log = CommitLog(Path(root) / "commitlog", SEGMENT, max_message_size=4 << 20)
        log.load()
    ready.set()
    while True:
        frames = sock.recv_multipart()
        if layer == "echo":
            sock.send_multipart(frames)
            continue
        req = decode_request(frames[1:], limits)
        f = req.fields
        if log is None:  # codec
            fields: dict[str, Any] = {"queueId": f["queueId"], "queueOffset": 0,
                                      "commitLogOffset": 0, "storeHost": "7F00000100002710"}
            if len(req.bodies) > 1:
                fields["offsets"] = list(range(len(req.bodies)))
        else:
            if req.code == RequestCode.SEND:
                msg = Message(f["topic"], req.bodies[0], f.get("tags"), f.get("keys"),
                              dict(f.get("properties") or {}), f.get("flag", 0))
                r = log.put(msg, f["queueId"])
            else:
                r = log.put_batch(f["topic"], f["queueId"], req.bodies)
            fields = {"queueId": r.queue_id, "queueOffset": r.queue_offset,
                      "commitLogOffset": r.phy_offset,
                      "storeHost": store_host_text(r.store_ip, r.store_port)}
            if len(r.record_offsets) > 1:
                fields["offsets"] = list(r.record_offsets)
        sock.send_multipart([frames[0], *encode_response(ResponseCode.SUCCESS, req.opaque, "",
                                                         fields)])


def _sync_master(client_port: int, ha_port: int, root: str,
                 ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    """The SYNC ``store`` row's master: the relay's loop with the real codec, store write and
    HA frames (runs until killed)."""
    from common.store.commit_log import CommitLog
    from master.role import store_host_text

    ctx = zmq.Context()
    front, ha = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    front.bind(f"tcp://127.0.0.1:{client_port}")
    ha.bind(f"tcp://127.0.0.1:{ha_port}")
    log = CommitLog(Path(root) / "master", SEGMENT, max_message_size=4 << 20)
    log.load()
    limits = Limits()
    ready.set()
    slave = ha.recv_multipart()[0]  # its hello
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(ha, zmq.POLLIN)
    waiting: collections.deque[tuple[bytes, int, dict[str, Any]]] = collections.deque()
    while True:
        events = dict(poller.poll())
        if front in events:
            frames = front.recv_multipart()
            req = decode_request(frames[1:], limits)
            f = req.fields
            if req.code == RequestCode.SEND:
                r = log.put(Message(f["topic"], req.bodies[0], f.get("tags"), f.get("keys"),
                                    dict(f.get("properties") or {}), f.get("flag", 0)),
                            f["queueId"])
            else:
                r = log.put_batch(f["topic"], f["queueId"], req.bodies)
            ha.send_multipart([slave, *ha_protocol.encode_data(
                1, 1, 0, r.phy_offset, log.read(r.phy_offset, r.wrote_bytes))])
            fields: dict[str, Any] = {"queueId": r.queue_id, "queueOffset": r.queue_offset,
                                      "commitLogOffset": r.phy_offset,
                                      "storeHost": store_host_text(r.store_ip, r.store_port)}
            if len(r.record_offsets) > 1:
                fields["offsets"] = list(r.record_offsets)
            waiting.append((frames[0], req.opaque, fields))
        if ha in events:
            msg = ha.recv_multipart()
            ack = ha_protocol.decode(msg[1:], HA_LIMITS)
            assert isinstance(ack, ha_protocol.Ack)
            client, opaque, fields = waiting.popleft()
            front.send_multipart([client, *encode_response(ResponseCode.SUCCESS, opaque, "",
                                                           fields)])


def _sync_slave(ha_port: int, root: str) -> None:
    """The SYNC ``store`` row's slave: each DATA frame decoded, appended, acknowledged."""
    from common.store.commit_log import CommitLog

    log = CommitLog(Path(root) / "slave", SEGMENT, max_message_size=4 << 20)
    log.load()
    log.open_replication()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{ha_port}")
    sock.send(b"hello")
    while True:
        data = ha_protocol.decode(sock.recv_multipart(), HA_LIMITS)
        assert isinstance(data, ha_protocol.Data)
        end = log.append_replicated(data.phy_offset, data.data)
        sock.send_multipart(ha_protocol.encode(ha_protocol.Ack(1, end, 1)))


def _raw_call(sock: zmq.Socket[bytes], bodies: int, size: int, shape: str) -> Callable[[], None]:
    """One request as Producer sends it, and its answer decoded; or the echo's or the relay's
    own request of the same bytes."""
    body = b"x" * size
    if shape in ("echo", "relay"):  # a header frame and one frame of the bodies
        msg = [b"h" * 16 if shape == "echo" else b"put", body * bodies]

        def bare_once() -> None:
            sock.send_multipart(msg)
            sock.recv_multipart()
        return bare_once
    opaque = iter(range(1, 1 << 62))
    code = RequestCode.SEND if bodies == 1 else RequestCode.SEND_BATCH

    def once() -> None:
        op = next(opaque)
        fields: dict[str, Any] = {"topic": "bench"}
        frames = [body] if bodies == 1 else pack_bodies(fields, [body] * bodies)
        fields["queueId"] = 0
        sock.send_multipart(encode_request(code, op, fields, frames))
        resp = decode_response(sock.recv_multipart(), CLIENT_LIMITS)
        if resp.code != ResponseCode.SUCCESS or resp.opaque != op:
            raise RuntimeError(f"unexpected answer {resp.code} {resp.remark}")
    return once


def _measure(name: str, call: Callable[[], None], pids: dict[str, int], count: int,
             bodies: int) -> dict[str, float]:
    for _ in range(200):
        call()
    requests = count // bodies
    with Meter(pids) as meter:
        for _ in range(requests):
            call()
    return report(name, requests * bodies, meter)


def _drive(layer: str, procs: list[multiprocessing.Process], names: tuple[str, ...],
           ready: multiprocessing.synchronize.Event,  # type: ignore[name-defined]
           port: int, bodies: int, size: int, count: int) -> dict[str, float]:
    """Measure one row against the server processes ``procs`` (``names``: how the report
    calls each), then kill them."""
    ctx = zmq.Context()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the {layer} server did not start")
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        pids = {name: proc.pid or 0 for name, proc in zip(names, procs, strict=True)}
        return _measure(layer, _raw_call(sock, bodies, size, layer), pids, count, bodies)
    finally:
        ctx.destroy(0)
        for proc in procs:
            proc.kill()
        end(procs)


def layer_row(layer: str, bodies: int, size: int, count: int, root: Path) -> dict[str, float]:
    port = _support.free_port()
    ready = multiprocessing.Event()
    proc = spawn(_server, layer, port, str(root / f"{layer}-{bodies}"), ready)
    return _drive(layer, [proc], ("server",), ready, port, bodies, size, count)


def sync_layer_row(layer: str, bodies: int, size: int, count: int,
                   root: Path) -> dict[str, float]:
    client_port, ha_port = _support.free_port(), _support.free_port()
    ready = multiprocessing.Event()
    where = str(root / f"{layer}-{bodies}")
    if layer == "relay":
        procs = [spawn(_relay_master, client_port, ha_port), spawn(_relay_slave, ha_port)]
        ready.set()
    else:
        procs = [spawn(_sync_master, client_port, ha_port, where, ready),
                 spawn(_sync_slave, ha_port, where)]
    return _drive(layer, procs, ("master", "slave"), ready, client_port, bodies, size, count)


def broker_rows(bodies: int, size: int, count: int, root: Path,
                sync: bool) -> dict[str, dict[str, float]]:
    slave = None
    if sync:
        broker, slave = group(root / f"group-{bodies}", "SYNC_MASTER")
    else:
        broker = Broker(root / f"broker-{bodies}", brokerRole="ASYNC_MASTER",
                        flushDiskType="ASYNC_FLUSH").start()
    out = {}
    ctx = zmq.Context()
    try:
        assert broker.proc is not None
        pids = {"master" if sync else "server": broker.proc.pid}
        if slave is not None:
            assert slave.proc is not None
            pids["slave"] = slave.proc.pid
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{broker.address}")
        out["broker"] = _measure("broker", _raw_call(sock, bodies, size, "codec"), pids, count,
                                 bodies)
        body = b"x" * size
        for row, spin_us in (("broker+Producer", DEFAULT_SPIN_US), ("Producer spin 0", 0)):
            with Producer([broker.address], retries=0, spin_us=spin_us) as p:
                out[row] = _measure(f"broker + Producer, spin_us={spin_us}",
                                    _producer_call(p, body, bodies), pids, count, bodies)
        return out
    finally:
        ctx.destroy(0)
        if slave is not None:
            slave.stop()
        broker.stop()


def _producer_call(p: Producer, body: bytes, bodies: int) -> Callable[[], None]:
    if bodies == 1:
        def send() -> None:
            if p.send("bench", body, queue_id=0).status != SendStatus.SEND_OK:
                raise RuntimeError("send failed")
        return send
    batch = [body] * bodies

    def send_batch() -> None:
        if p.send_batch("bench", batch, queue_id=0)[0].status != SendStatus.SEND_OK:
            raise RuntimeError("send_batch failed")
    return send_batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=4000,
                    help="messages per single row (batch rows send 32x as many, SYNC batch 16x)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=list(CASES), default=list(CASES))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="replog-layers-"))
    try:
        print(f"put CPU by layer, 1 request in flight, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        for case in args.only:
            bodies, size = CASES[case]
            sync = case.startswith("sync")
            count = args.count if bodies == 1 else args.count * (16 if sync else 32)
            layers = SYNC_LAYERS if sync else LAYERS
            rows = [*layers, "broker", "broker+Producer", "Producer spin 0"]
            rounds: list[dict[str, dict[str, float]]] = []
            for r in range(args.rounds):
                print(f"{case} ({bodies} x {size} B per request), round {r + 1}", flush=True)
                row_of = sync_layer_row if sync else layer_row
                figures = {layer: row_of(layer, bodies, size, count, home / f"r{r}")
                           for layer in layers}
                figures.update(broker_rows(bodies, size, count, home / f"r{r}", sync))
                rounds.append(figures)
                shutil.rmtree(home / f"r{r}", ignore_errors=True)
            base = layers[0]
            print(f"{case}: medians over {args.rounds} rounds (rate ratio to the {base} within "
                  "each round; CPU us per message)")
            for row in rows:
                keys = [k for k in rounds[0][row] if k not in ("rate",)]
                med = {k: statistics.median(f[row][k] for f in rounds) for k in ["rate", *keys]}
                ratio = statistics.median(f[row]["rate"] / f[base]["rate"] for f in rounds)
                cpu = "  ".join(f"{k} {med[k]:7.1f}" for k in keys)
                print(f"  {row:<16} {med['rate']:>9.0f} msg/s  {ratio:5.2f}x {base:<6} {cpu}",
                      flush=True)
        return 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
