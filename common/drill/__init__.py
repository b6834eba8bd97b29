"""Reliability drills as package code (docs/drills.md): what the process drills of
``tests/drills`` and ``replog drill`` share.

    history    the JSON-lines history, message bodies with their id and CRC, put outcomes
    workload   producer and consumer workers, bursts, the final drain, deadline waits
    checker    Jepsen's total-queue checker, failover and recovery times, the final verdict
    group      the controller-mode group seen from its brokers' status (the elected master)
    scenario   a fault scenario run against a backend: load, faults, heal, check, report
    backends   the fault primitives: ``process`` (local broker processes) and ``docker``
               (the compose project's containers, through the Docker SDK)

Layer: ``drill`` imports core, format and client only (tests/unit/test_layering.py); the
``replog drill`` command (``common/cli/drill.py``) builds the process group and hands it in.
"""
