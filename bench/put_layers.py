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
"""

from __future__ import annotations

import argparse
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
from replication import Broker

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

CASES = {"single": 1, "batch": 64}  # bodies per request
SIZE = 128
LAYERS = ("echo", "codec", "store")
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


def _raw_call(sock: zmq.Socket[bytes], bodies: int, echo: bool) -> Callable[[], None]:
    """One request as Producer sends it, and its answer decoded (or the echo's frames)."""
    body = b"x" * SIZE
    if echo:  # the echo's own shape: a header frame and one frame of the bodies
        msg = [b"h" * 16, body * bodies]

        def echo_once() -> None:
            sock.send_multipart(msg)
            sock.recv_multipart()
        return echo_once
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


def _measure(name: str, call: Callable[[], None], pid: int, count: int,
             bodies: int) -> dict[str, float]:
    for _ in range(200):
        call()
    requests = count // bodies
    with Meter({"server": pid}) as meter:
        for _ in range(requests):
            call()
    return report(name, requests * bodies, meter)


def layer_row(layer: str, bodies: int, count: int, root: Path) -> dict[str, float]:
    port = _support.free_port()
    ready = multiprocessing.Event()
    proc = spawn(_server, layer, port, str(root / f"{layer}-{bodies}"), ready)
    ctx = zmq.Context()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the {layer} server did not start")
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        assert proc.pid is not None
        return _measure(layer, _raw_call(sock, bodies, layer == "echo"), proc.pid, count, bodies)
    finally:
        ctx.destroy(0)
        proc.kill()
        end([proc])


def broker_rows(bodies: int, count: int, root: Path) -> dict[str, dict[str, float]]:
    broker = Broker(root / f"broker-{bodies}", brokerRole="ASYNC_MASTER",
                    flushDiskType="ASYNC_FLUSH").start()
    out = {}
    ctx = zmq.Context()
    try:
        assert broker.proc is not None
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{broker.address}")
        out["broker"] = _measure("broker", _raw_call(sock, bodies, False), broker.proc.pid,
                                 count, bodies)
        body = b"x" * SIZE
        for row, spin_us in (("broker+Producer", DEFAULT_SPIN_US), ("Producer spin 0", 0)):
            with Producer([broker.address], retries=0, spin_us=spin_us) as p:
                out[row] = _measure(f"broker + Producer, spin_us={spin_us}",
                                    _producer_call(p, body, bodies), broker.proc.pid, count,
                                    bodies)
        return out
    finally:
        ctx.destroy(0)
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
                    help="messages per single row (batch rows send 32x as many)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=list(CASES), default=list(CASES))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="replog-layers-"))
    rows = [*LAYERS, "broker", "broker+Producer", "Producer spin 0"]
    try:
        print(f"put CPU by layer, {SIZE} B bodies, 1 request in flight, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        for case in args.only:
            bodies = CASES[case]
            count = args.count if bodies == 1 else args.count * 32
            rounds: list[dict[str, dict[str, float]]] = []
            for r in range(args.rounds):
                print(f"{case} ({bodies} per request), round {r + 1}", flush=True)
                figures = {layer: layer_row(layer, bodies, count, home / f"r{r}")
                           for layer in LAYERS}
                figures.update(broker_rows(bodies, count, home / f"r{r}"))
                rounds.append(figures)
                shutil.rmtree(home / f"r{r}", ignore_errors=True)
            print(f"{case}: medians over {args.rounds} rounds (rate ratio to the echo within "
                  "each round)")
            for row in rows:
                rate, client, server, total = (
                    statistics.median(f[row][key] for f in rounds)
                    for key in ("rate", "client", "server", "total"))
                ratio = statistics.median(f[row]["rate"] / f["echo"]["rate"] for f in rounds)
                print(f"  {row:<16} {rate:>9.0f} msg/s  {ratio:5.2f}x echo   CPU us/msg: "
                      f"client {client:7.1f}  server {server:7.1f}  total {total:7.1f}",
                      flush=True)
        return 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
