"""The ``replog`` command: its arguments and the command each runs (``docs/contract.md``).

    replog broker -c FILE [--set k=v]...
    replog cluster up [--dir D] [--groups G] [--slaves N] [--mode sync|async] [--base-port P]
                      [--duration S] [--no-controller] [--zk-port P] [--session-ms MS]
    replog controller status
    replog send -t TOPIC (-b BODY | --file F | --count N --size BYTES) [--tags T] [--keys K]
                [--queue Q] [--broker-name B] [--delay-level L | --deliver-at T | --delay SPAN]
                [--transaction commit|rollback|unknown [--group G]]
    replog recall -t TOPIC HANDLE
    replog timer status
    replog transactions [--from N] [-n MAX] [--end OFFSET (--commit | --rollback)]   (admin)
    replog pull -t TOPIC [-q QUEUE] [--broker-name B] [-o OFFSET] [-n MAX] [--group G]
                [--tags 'A || B' | --sql EXPR]
    replog query (--topic T --key K | --msg-id ID | --offset PHYOFFSET)
    replog offsets -t TOPIC [-q QUEUE] [--time T] [--group G [--reset]]   (an extension)
    replog consume -t TOPIC[,TOPIC] --group G [--from latest|earliest] [-n MAX]
                   [--broadcasting [--offsets-file F]]   (an extension)
    replog topics [-t TOPIC] [--create TOPIC --queues N [--broker-names A,B]]   (an extension)
    replog groups [--group G] [--create G [--orderly] [--retry-max N] [--consume-disable]]
                  [--delete G [--clean-offset]]   (an extension)
    replog proxy [--grpc-port P] [--listen HOST]   (RocketMQ 5's gRPC protocol over -s)
    replog console [--listen HOST:PORT] [--admin-password-file F]   (the web console)
    replog status [--cluster]
    replog promote
    replog keys new NAME [-d DIR]   (a CURVE key pair: NAME.key, NAME.key_secret)
    replog acl [--check FILE]   (the ACL in force, admin; or check a file here)
    replog drill [--backend process|docker] [--faults FAULT=N,...] [--seed S] [--json]

Client commands take ``-s/--servers host:port[,...]``, ``--json`` (one JSON document on
stdout) and, for brokers with ``aclEnable``, ``--key KEY_SECRET --server-key KEY`` (or
REPLOG_KEY and REPLOG_SERVER_KEY; docs/security.md; ``query``, whose ``--key`` is a message
key, takes ``--key-file``). Exit status: 0 success, 1 refused or
failed (the outcome is still printed), 2 bad usage.

The commands live one family a module: ``messages`` (send, pull, query), ``consumers``
(offsets, consume, dlq), ``admin`` (topics, groups, status, promote), ``cluster`` (cluster up),
``security`` (keys, acl), ``drill`` (a failover drill against a process group or the compose
cluster) and ``bootstrap`` (broker: the composition root, the one module that imports
``master/`` and ``slave/``). Output helpers and exit codes: ``output``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.cli import (
    admin,
    cluster,
    console,
    consumers,
    drill,
    messages,
    proxy,
    security,
    timers,
    transactions,
)
from common.cli.bootstrap import run_broker
from common.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    emit_json,
    err,
    error_doc,
)
from common.client import parse_servers
from common.core.config import ConfigError
from common.core.errors import BrokerError, ResponseCode
from common.core.message import DEFAULT_COMPRESS_OVER_BYTES

DEFAULT_SERVERS = "127.0.0.1:10911"
LISTEN_PROBE_S = 1.0  # a TCP connect to the -s brokers before a client command


class HELP_FORMAT(argparse.HelpFormatter):
    """``--help`` shows each option's default, where it has one (not None or off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("%(default)" not in text and action.option_strings
                and action.default not in (None, False, [], argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replog", description="replicated commit-log broker")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", formatter_class=HELP_FORMAT, help="run one broker")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("pipeline", formatter_class=HELP_FORMAT, help="run a Spark job: audit, stats or reindex",
                       add_help=False)
    p.add_argument("job_args", nargs=argparse.REMAINDER)

    p = sub.add_parser("cluster", formatter_class=HELP_FORMAT, help="run local broker groups on one ZooKeeper")
    p.add_argument("action", choices=["up"])
    p.add_argument("--dir", default="run/cluster")
    p.add_argument("--groups", type=int, default=1,
                   help="broker groups broker-a, broker-b, ... (default %(default)s)")
    p.add_argument("--slaves", type=int, default=2)
    p.add_argument("--mode", choices=["sync", "async"], default="sync")
    p.add_argument("--base-port", type=int, default=10911)
    p.add_argument("--duration", type=float, default=0.0, help="seconds; 0 runs until Ctrl-C")
    p.add_argument("--no-controller", action="store_true",
                   help="no local ZooKeeper: broker-0 is the master, failover is `promote`")
    p.add_argument("--zk-port", type=int, help="the local ZooKeeper's port (base port + 90)")
    p.add_argument("--session-ms", type=int, default=4000,
                   help="controller session timeout of the local group (default %(default)s)")
    p.add_argument("--secure", action="store_true",
                   help="CURVE and an ACL: keys and acl.yml made under --dir")
    p.add_argument("--console-port", type=int, default=0,
                   help="the web console's port on 127.0.0.1 (default: base port + 88)")
    p.add_argument("--no-console", action="store_true", help="no web console")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("keys", formatter_class=HELP_FORMAT, help="make a CURVE key pair")
    p.add_argument("action", choices=["new"])
    p.add_argument("name")
    p.add_argument("-d", "--dir", default=".", help="where NAME.key and NAME.key_secret go")
    p.add_argument("--json", action="store_true")

    p = _client(sub, "send", "produce messages")
    p.add_argument("-t", "--topic", required=True, help="the topic (made on first use)")
    p.add_argument("-b", "--body", help="one message with this body")
    p.add_argument("--file", help="one message with this file's bytes as its body")
    p.add_argument("--count", type=int, help="N messages (pipelined), of --size bytes")
    p.add_argument("--size", type=int, help="with --count: each body's length in bytes")
    p.add_argument("--tags", help="the message's tag (TAGS, consumers filter on it)")
    p.add_argument("--keys", help="space-separated keys (KEYS, replog query --key finds it)")
    p.add_argument("--queue", type=int, help="this queue id (default: round robin)")
    p.add_argument("--shard-key", help="every message of a key to one queue, in order")
    p.add_argument("--broker-name", help="the broker group to send to (with --queue: the "
                   "queue's group, needed when several groups hold the topic)")
    p.add_argument("--delay-level", type=int, default=0,
                   help="deliver after messageDelayLevel's level L (1: 1s ... 18: 2h)")
    p.add_argument("--deliver-at", metavar="TIME",
                   help="a timer message: deliver at TIME (ISO 8601, e.g. 2026-12-01T09:00:00Z; "
                   "no zone: local time; or epoch ms)")
    p.add_argument("--delay", metavar="SPAN",
                   help="a timer message: deliver SPAN after the broker receives it (1500ms, "
                   "90s, 5m, 2h, 1d; a bare number is ms)")
    p.add_argument("--compress-over", type=int, default=DEFAULT_COMPRESS_OVER_BYTES,
                   metavar="BYTES",
                   help="deflate bodies of at least BYTES (default %(default)s, 0: never)")
    p.add_argument("--transaction", choices=("commit", "rollback", "unknown"),
                   help="a transactional message: send the half, then end it so (unknown: "
                   "leave it to the broker's check-back, which asks a live producer of "
                   "--group)")
    p.add_argument("--group", default="replog-cli",
                   help="with --transaction: the producer group (default %(default)s)")

    p = _client(sub, "recall", "cancel a timer message that is not due yet")
    p.add_argument("-t", "--topic", required=True, help="the message's topic")
    p.add_argument("handle", help="the recall handle its send printed (recallHandle)")

    p = _client(sub, "timer", "the timer of each broker: pending messages, lateness, rolls")
    p.add_argument("action", choices=["status"])

    p = _client(sub, "transactions", "the transactions the check-back gave up (admin), and "
                "ending one by hand")
    transactions.add_arguments(p)

    p = _client(sub, "pull", "read from a consume queue")
    p.add_argument("-t", "--topic", required=True, help="the topic")
    p.add_argument("-q", "--queue", type=int, default=0, help="the queue id")
    p.add_argument("-o", "--offset", type=int,
                   help="the queue offset to read from (default: --group's committed one)")
    p.add_argument("-n", "--max", type=int, default=32, help="messages at most")
    p.add_argument("--group", default="replog-cli", help="the consumer group")
    p.add_argument("--suspend-ms", type=int, default=0,
                   help="at the end of the queue, wait this long for a message (long poll)")
    p.add_argument("--broker-name", help="the queue's broker group (needed when several "
                   "groups hold the topic)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--tags", help="only messages of these tags: TagA || TagB")
    how.add_argument("--sql", help="only messages whose properties match this SQL92 "
                     "expression, e.g. \"a > 5 AND b = 'x'\" (the broker needs "
                     "enablePropertyFilter)")

    p = _client(sub, "consume", "read topics as a member of a consumer group")
    p.add_argument("-t", "--topic", required=True, help="a topic or t1,t2")
    p.add_argument("--group", required=True)
    p.add_argument("--from", dest="start", choices=["latest", "earliest"], default="latest",
                   help="where a queue the group never committed starts")
    p.add_argument("-n", "--max", type=int, default=0, help="stop after N messages (0: no limit)")
    p.add_argument("--idle-s", type=float, default=10.0, help="stop after S seconds without one")
    p.add_argument("--broadcasting", action="store_true",
                   help="read every queue (every message), offsets kept in a local file")
    p.add_argument("--offsets-file", help="with --broadcasting: where the offsets are kept "
                   "(default ~/.replog_offsets/<host>@DEFAULT/<group>/offsets.json)")
    g = p.add_argument_group("POP (RocketMQ 5's SimpleConsumer: no rebalance, each message to "
                             "one consumer, acked one by one)")
    g.add_argument("--pop", action="store_true", help="consume by POP (one topic)")
    g.add_argument("--invisible-ms", type=int, default=30_000,
                   help="with --pop: how long a received message stays hidden from the group")
    g.add_argument("--fifo", action="store_true",
                   help="with --pop: a message group's messages one at a time, in order")
    g.add_argument("--no-ack", action="store_true",
                   help="with --pop: receive without acking (they come back, counted)")

    p = _client(sub, "dlq", "a consumer group's dead letters; --resend sends them to it again")
    p.add_argument("--group", required=True)
    p.add_argument("-n", "--max", type=int, default=32)
    p.add_argument("--resend", action="store_true",
                   help="send them to the group's retry topic and move past them")

    p = _client(sub, "query", "look a message up")
    p.add_argument("--topic")
    p.add_argument("--key")
    p.add_argument("--msg-id")
    p.add_argument("--offset", type=int)
    p.add_argument("-n", "--max", type=int, default=32)

    p = _client(sub, "offsets", "a topic's queue offsets; the offset at a time; a group's lag")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-q", "--queue", type=int, help="one queue (default: every queue)")
    p.add_argument("--time", help="ms since the epoch or ISO 8601: the first offset stored then")
    p.add_argument("--group", help="show the group's committed offsets and lag")
    p.add_argument("--reset", action="store_true",
                   help="commit the offsets at --time for --group (replay or skip from then)")
    p.add_argument("--broker-name", help="only the queues of this broker group")

    p = _client(sub, "topics", "the cluster's topics, queues and messages per broker group; "
                "make or grow a topic")
    p.add_argument("-t", "--topic", help="only this topic")
    p.add_argument("--create", metavar="TOPIC", help="make TOPIC, or give it more queues, on "
                   "every broker group's master")
    p.add_argument("--queues", type=int, help="with --create: the queue count (never fewer)")
    p.add_argument("--broker-names", metavar="A,B", help="with --create: only these groups")
    p.add_argument("--attr", action="append", metavar="NAME=VALUE",
                   help="with --create: a topic attribute, e.g. message.type=FIFO (every "
                   "message needs a message group); given, they replace the topic's")

    p = _client(sub, "groups", "consumer groups: members, lag per topic, dead letters, POP "
                "figures and configs; make, change or delete a group's config")
    p.add_argument("--group", help="only this group")
    p.add_argument("--create", metavar="GROUP", help="make or change GROUP's config "
                   "(subscriptionGroup.json) on every broker group's master")
    p.add_argument("--orderly", action="store_true", help="with --create: the group's POPs "
                   "hand out each queue in order (FIFO: consumeMessageOrderly)")
    p.add_argument("--retry-max", type=int, metavar="N", help="with --create: times a message "
                   "is handed out again before the group's DLQ (retryMaxTimes, default 16)")
    p.add_argument("--consume-disable", action="store_true", help="with --create: refuse the "
                   "group's pulls and POPs (consumeEnable false)")
    p.add_argument("--delete", metavar="GROUP", help="forget GROUP's config on every master")
    p.add_argument("--clean-offset", action="store_true",
                   help="with --delete: its committed offsets too")
    p.add_argument("--broker-names", metavar="A,B",
                   help="with --create/--delete: only these groups")

    p = _client(sub, "producers", "a producer group's live producers (admin); "
                "--running-info: each one's own figures, asked by the broker")
    p.add_argument("--group", required=True, help="the producer group")
    p.add_argument("--running-info", action="store_true",
                   help="have each master ask every producer for its running figures")

    p = _client(sub, "acl", "the ACL a broker has in force (admin); --check FILE checks one")
    p.add_argument("--check", metavar="FILE", help="parse FILE here, as a broker would")

    p = _client(sub, "proxy", "serve RocketMQ 5's gRPC protocol (the official clients) over "
                "the cluster, until Ctrl-C")
    p.add_argument("-c", "--config", metavar="FILE", help="a broker-style YAML file: its "
                   "grpcServerPort, grpcBindAddress and maxMessageSize (the broker's keys)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key, as for replog broker")
    p.add_argument("--grpc-port", type=int, help="the gRPC port (default: grpcServerPort, "
                   "else 8081, RocketMQ's proxy's)")
    p.add_argument("--listen", help="the interface it listens on (default: grpcBindAddress, "
                   "else 0.0.0.0)")
    p.add_argument("--max-body-size", type=int, help="the largest body it passes on (default: "
                   "maxMessageSize, 4 MiB: the brokers')")

    p = _client(sub, "console", "serve the web console over the cluster, until Ctrl-C")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="where it serves (default 127.0.0.1:8080)")
    p.add_argument("--admin-password-file", metavar="FILE", help="a file (mode 0600) holding "
                   "the admin password: changes need a login with it (default: read-only)")
    p.add_argument("--acl-file", metavar="FILE", help="the brokers' ACL (aclEnable): a login "
                   "is an enabled admin account's accessKey and secretKey")
    p.add_argument("--refresh-ms", type=int, default=2000, help="how often it reads the "
                   "cluster (default 2000)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a name browsers reach it by, besides localhost, IP addresses and the "
                   "--listen host (repeat for more); a request naming another Host is "
                   "refused 421 (DNS rebinding)")
    p.add_argument("--max-connections", type=int, default=64, metavar="N",
                   help="connections served at once; more are answered 503 (default 64)")
    p.set_defaults(timeout_ms=3000)  # per request: a member that does not answer by then is
    # shown unreachable

    p = _client(sub, "status", "one broker's state (--cluster: every broker group's)")
    p.add_argument("--cluster", action="store_true",
                   help="every broker group of the cluster: master, epoch, set, topics")
    p = _client(sub, "promote", "turn the slave at -s into the master "
                "(controller mode: a planned switchover to it)")
    p.add_argument("--role", choices=["SYNC_MASTER", "ASYNC_MASTER"], default="SYNC_MASTER")
    p = _client(sub, "controller", "the controller's view: master, epoch, SyncStateSet; "
                "clear-fault: let the broker at -s stand in elections again")
    p.add_argument("action", choices=["status", "clear-fault"],
                   help="status: every group's master, epoch and set (default); clear-fault: "
                   "the broker at -s failed to take over as master and stands in no "
                   "election until this")
    drill.add_parser(sub)
    return parser


def _client(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text,
                                                formatter_class=HELP_FORMAT)
    p.add_argument("-s", "--servers", default=DEFAULT_SERVERS, type=_servers_arg,
                   metavar="HOST:PORT[,...]", help="brokers to ask: any of the cluster's")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--timeout-ms", type=int, default=10_000, help="per request")
    # ``replog query --key K`` is a message key: there the CURVE key is --key-file only
    names = ("--key-file",) if name == "query" else ("--key", "--key-file")
    p.add_argument(*names, dest="curve_key", default=os.environ.get("REPLOG_KEY"),
                   metavar="KEY_SECRET",
                   help="CURVE: this client's .key_secret file (env REPLOG_KEY)")
    p.add_argument("--server-key", default=os.environ.get("REPLOG_SERVER_KEY"),
                   metavar="KEY", help="CURVE: the brokers' public .key file, or "
                   "host:port=KEY,... one per broker (env REPLOG_SERVER_KEY)")
    return p


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "send": messages.cmd_send,
    "recall": messages.cmd_recall,
    "transactions": transactions.cmd_transactions,
    "timer": timers.cmd_timer,
    "pull": messages.cmd_pull,
    "query": messages.cmd_query,
    "offsets": consumers.cmd_offsets,
    "topics": admin.cmd_topics,
    "groups": admin.cmd_groups,
    "producers": admin.cmd_producers,
    "consume": consumers.cmd_consume,
    "dlq": consumers.cmd_dlq,
    "status": admin.cmd_status,
    "promote": admin.cmd_promote,
    "controller": admin.cmd_controller,
    "cluster": cluster.cmd_cluster,
    "keys": security.cmd_keys,
    "acl": security.cmd_acl,
    "drill": drill.cmd_drill,
    "proxy": proxy.cmd_proxy,
    "console": console.cmd_console,
}


def _servers_arg(text: str) -> str:
    """``-s`` checked while parsing, so a malformed one is bad usage (exit 2), not a failure."""
    try:
        parse_servers(text)
    except BrokerError as e:
        raise argparse.ArgumentTypeError(e.remark) from None
    return text


def _require_listener(servers: str) -> None:
    """Fail at once, saying what to do, when nothing listens at any of ``servers``: a client
    would otherwise wait out its whole timeout for a broker that is not running."""
    addresses = parse_servers(servers)
    refused = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), LISTEN_PROBE_S):
                return
        except OSError as e:
            if not isinstance(e, ConnectionRefusedError):
                return  # unreachable or slow, not refused: the client's own timeout decides
            refused.append(address)
    raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                      f"nothing listens at {', '.join(refused)} (connection refused): start a "
                      "broker group with `replog cluster up`, or name a running broker with "
                      "-s HOST:PORT", False)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pipeline"]:  # the Spark jobs parse their own arguments
        from common.pipeline.jobs import main as pipeline_main

        return pipeline_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "broker":
            return run_broker(args.config, args.set)
        # (acl --check reads a file, no broker; a console or a proxy starts before its brokers
        # and shows, or answers, that none is there until one is)
        if isinstance(getattr(args, "servers", None), str) and not getattr(args, "check", None) \
                and args.command not in ("console", "proxy"):
            _require_listener(args.servers)
        return COMMANDS[args.command](args)
    except UsageError as e:
        parser.error(str(e))  # exits 2
    except ConfigError as e:
        err.print(f"replog: {e}")
        return EXIT_USAGE
    except BrokerError as e:
        if getattr(args, "json", False):
            emit_json(error_doc(e))
        else:
            err.print(f"replog: {e.code.name}: {e.remark}")
        return EXIT_FAILED
    except OSError as e:
        err.print(f"replog: {e}")
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())


