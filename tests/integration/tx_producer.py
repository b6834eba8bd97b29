"""A producer process of the transaction drill (``test_transaction_failover.py``): runs
transactions until it is killed, each decided by ``local`` (COMMIT, ROLLBACK, or UNKNOWN: left
open for the check-back), and answers checks by ``final``, as an application answers from its
database. Logs each half it had acknowledged, and each end, as JSON lines.

    python tx_producer.py ADDRESSES GROUP FIRST_SEQ LOG
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
import time

TOPIC = "txd"
BODY = struct.Struct(">q")


def _roll(seq: int, salt: bytes) -> int:
    return hashlib.sha256(salt + str(seq).encode()).digest()[0]


def final(seq: int) -> str:
    """What the transaction of ``seq`` decides, in the end."""
    return "COMMIT" if _roll(seq, b"final") < 160 else "ROLLBACK"


def local(seq: int) -> str:
    """What the local transaction says at once (UNKNOWN: not yet, ask me later)."""
    return "UNKNOWN" if _roll(seq, b"local") < 40 else final(seq)


def main() -> int:
    from common.client import TransactionProducer, TransactionState
    from common.core.errors import BrokerError, SendStatus

    addresses, group, first, path = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), \
        sys.argv[4]
    rng = random.Random(first)
    with open(path, "a", buffering=1) as log, TransactionProducer(
            addresses, group, lambda half: TransactionState(final(BODY.unpack(half.body)[0])),
            heartbeat_ms=300, timeout_ms=8000) as tp:
        seq = first
        while True:
            seq += 1
            try:
                half = tp.send_half(TOPIC, BODY.pack(seq), queue_id=0)
            except BrokerError as e:
                log.write(json.dumps({"unsure": seq, "error": e.code.name}) + "\n")
                time.sleep(0.05)
                continue
            ok = half.send.status == SendStatus.SEND_OK
            log.write(json.dumps({"half" if ok else "unsure": seq}) + "\n")
            time.sleep(rng.uniform(0, 0.02))  # a window for a kill between the half and the end
            state = local(seq)
            if state == "UNKNOWN":
                continue
            try:
                tp.end(half, TransactionState(state))
                log.write(json.dumps({"end": seq, "state": state}) + "\n")
            except BrokerError as e:
                log.write(json.dumps({"end_failed": seq, "error": e.code.name}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
