"""A consumer process of the POP drill (``test_pop_failover.py``): receives from a topic by POP
until killed or told to stop (a file), acks most of what it gets (a few it lets time out, to be
handed out again), and logs each delivery, each ack before it is sent (``acking``, with its
receipt handle: a consumer killed while its ack is on the way leaves that line, and the checker
asks the broker what became of it) and each ack the broker confirmed, as JSON lines with
wall-clock times.

    python pop_consumer.py ADDRESSES GROUP TOPIC FIFO(0|1) SEED LOG STOP_FILE
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

INVISIBLE_MS = 2_000


def main() -> int:
    from common.client import SimpleConsumer
    from common.core.errors import BrokerError

    addresses, group, topic = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    fifo, rng, path, stop = sys.argv[4] == "1", random.Random(sys.argv[5]), sys.argv[6], \
        sys.argv[7]
    with open(path, "a", buffering=1) as log, SimpleConsumer(
            addresses, group, timeout_ms=5000, retries=2) as consumer:
        while not os.path.exists(stop):
            try:
                got = consumer.receive(topic, 8, INVISIBLE_MS, wait_ms=1000, fifo=fifo)
            except BrokerError as e:
                log.write(json.dumps({"error": e.code.name, "t": time.time()}) + "\n")
                time.sleep(0.2)
                continue
            for r in got:
                seq = int(r.message.body.split(b"|")[0])
                log.write(json.dumps({"got": seq, "times": r.message.reconsume_times,
                                      "key": r.message.properties.get("__SHARDINGKEY"),
                                      "topic": r.message.topic, "q": r.message.queue_id,
                                      "o": r.message.queue_offset,
                                      "t": time.time()}) + "\n")
            for r in got:
                if rng.random() < 0.1:
                    continue  # not acked: handed out again after its invisible time
                seq = int(r.message.body.split(b"|")[0])
                asked = time.time()  # the broker cannot have taken the ack before this
                log.write(json.dumps({"acking": seq, "handle": r.receipt_handle,
                                      "asked": asked}) + "\n")
                try:
                    consumer.ack(r)
                except BrokerError as e:  # a handle spent, or the master changed
                    log.write(json.dumps({"ack_failed": seq, "error": e.code.name,
                                          "t": time.time()}) + "\n")
                    continue
                log.write(json.dumps({"acked": seq, "times": r.message.reconsume_times,
                                      "topic": r.message.topic, "q": r.message.queue_id,
                                      "o": r.message.queue_offset,
                                      "asked": asked, "t": time.time()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
