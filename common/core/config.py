"""Broker configuration: YAML with Apache RocketMQ's ``broker.conf`` key names.

Precedence, lowest first: defaults (RocketMQ's) < YAML file < ``REPLOG_<key>`` environment
variables < ``--set key=value`` overrides. Unknown keys and ill-typed values are refused with a
``ConfigError`` naming the key and, for unknown keys, the closest known one.

Attribute names are the RocketMQ keys themselves (``cfg.mappedFileSizeCommitLog``) so that an
operator's knowledge, the YAML and the code all use one vocabulary.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from common.core.errors import ConfigError

ROLES = ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE")
FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


# The largest DATA frame a master may send (haTransferBatchSize's ceiling): a slave accepts
# frames up to this whatever its own haTransferBatchSize, so a master and slaves configured
# differently (a default changed, a rolling upgrade) still replicate.
HA_MAX_TRANSFER_BATCH = 1024 * 1024

# The timer wheel: this many slots whatever the precision (RocketMQ's 7 days of seconds)
TIMER_WHEEL_TICKS = 7 * 86_400

@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Every key a broker understands, with RocketMQ's defaults. Frozen once loaded: what a
    broker is now (a promoted slave, a master following another) is its role manager's state
    (``common/broker/role_manager.py``), never an edit of its configuration."""

    # identity and role
    brokerClusterName: str = "DefaultCluster"
    brokerName: str = "broker-a"
    brokerId: int = 0
    brokerRole: str = "ASYNC_MASTER"
    brokerIP1: str = "127.0.0.1"
    listenPort: int = 10911
    haListenPort: int = 0  # 0 means listenPort + 1
    haMasterAddress: str = ""
    # replog: client addresses (host:port,...) of the group's other brokers. A master that
    # starts while one of them is the master of a newer epoch joins that one as a slave.
    groupServers: str = ""
    metricsPort: int = 0  # 0: no Prometheus endpoint
    # RocketMQ 5's gRPC protocol (RocketMQ's proxy key): 0 off; the interface it listens on
    grpcServerPort: int = 0
    grpcBindAddress: str = ""
    # the gRPC port's TLS (RocketMQ's proxy keys; PEM files): both or neither, required with
    # aclEnable; and with aclEnable the .key_secret its calls reach the brokers with (an
    # admin account: the front end authorizes each call itself, docs/security.md)
    tlsCertPath: str = ""
    tlsKeyPath: str = ""
    grpcClientKeyFile: str = ""
    # replog: the interfaces the HA and metrics ports listen on. "": the HA port on every one
    # (with aclEnable CURVE admits replica accounts only), the metrics port on every one, or
    # on 127.0.0.1 only with aclEnable (nothing authenticates a scrape)
    haBindAddress: str = ""
    metricsBindAddress: str = ""
    # store layout
    storePathRootDir: str = "~/store"
    mappedFileSizeCommitLog: int = 1024 * 1024 * 1024
    mappedFileSizeConsumeQueue: int = 300_000 * 20
    # flushing
    flushDiskType: str = "ASYNC_FLUSH"
    syncFlushTimeout: int = 5000
    flushIntervalCommitLog: int = 500
    flushCommitLogLeastPages: int = 4
    flushCommitLogThoroughInterval: int = 10_000
    flushIntervalConsumeQueue: int = 1000
    flushConsumeQueueLeastPages: int = 2
    flushConsumeQueueThoroughInterval: int = 60_000
    warmMapedFileEnable: bool = False
    # messages
    maxMessageSize: int = 4 * 1024 * 1024
    maxTopicLength: int = 127
    putLockWarnMs: int = 1000  # put lock held longer than this -> OS_PAGE_CACHE_BUSY
    enabledAppendPropCRC: bool = True  # RocketMQ 5: whole-record CRC in a reserved property
    forceVerifyPropCRC: bool = True  # recovery refuses records without that CRC
    # replication
    slaveTimeout: int = 3000
    inSyncReplicas: int = 2
    haMaxGapNotInSync: int = 256 * 1024 * 1024
    haTransferBatchSize: int = 128 * 1024  # RocketMQ: 32 KiB; 128 KiB carries a batch of 64 x 1 KiB in one frame
    haSendHeartbeatInterval: int = 5000
    haHousekeepingInterval: int = 20_000
    haWindowBytes: int = 4 * 1024 * 1024
    haFlowControlEnable: bool = False  # RocketMQ 5: cap each slave's transfer rate
    maxHaTransferByteInSecond: int = 100 * 1024 * 1024
    # replog: how often a slave copies its master's topics, consumer offsets and delay offsets
    # (RocketMQ's SlaveSynchronize, every 10 s there); 0: never
    slaveConfigSyncIntervalMs: int = 1000
    # controller mode (RocketMQ 5's key names): the group elects its master through ZooKeeper
    # (docs/operations.md "Automatic failover"); brokerRole then names the mode a broker runs
    # while it is the master, and brokerId is its member id in the group (1..255)
    enableControllerMode: bool = False
    controllerAddr: str = ""  # host:port[,host:port...][/chroot] of the ZooKeeper ensemble
    controllerSessionTimeoutMs: int = 10_000  # replog: the ZooKeeper session timeout
    controllerLeaseMs: int = 0  # replog: a master's write lease; 0: half the session timeout
    controllerPollIntervalMs: int = 5000  # replog: read the group state even without a watch
    enableElectUncleanMaster: bool = False  # elect outside the SyncStateSet (may lose data)
    haMaxTimeSlaveNotCatchup: int = 15_000  # a slave behind this long leaves the SyncStateSet
    brokerElectionPriority: int = 2**31 - 1  # lower wins among equals (RocketMQ's default)
    switchoverTimeoutMs: int = 10_000  # replog: a planned handover waits this long at most
    # replog: a file holding "user:password": ZooKeeper digest auth for the controller, and an
    # ACL on every znode it creates (only that identity reads or changes them); "": none
    controllerAuthFile: str = ""
    # retention
    fileReservedTime: int = 72
    deleteWhen: str = "04"
    diskMaxUsedSpaceRatio: int = 75
    deleteFileBatchMax: int = 10
    cleanResourceInterval: int = 10_000
    # schedule / index / topics
    messageDelayLevel: str = DEFAULT_DELAY_LEVELS
    # timer messages (RocketMQ 5's names and defaults; common/store/timer/)
    timerWheelEnable: bool = True
    timerPrecisionMs: int = 1000  # a tick: deliveries are late by less than one, never early
    timerMaxDelaySec: int = 259_200  # 3 days: a later delivery is refused
    timerRollWindowSlot: int = 172_800  # ticks ahead the wheel holds; later ones are re-put
    timerFlushIntervalMs: int = 1000  # the timer's checkpoint
    timerCongestNumEachSlot: int = 2_147_483_647  # a tick holding this many refuses more
    # transactions (RocketMQ's names): a half older than transactionTimeOut without an end is
    # checked with its producer group every transactionCheckInterval, at most
    # transactionCheckMax times (then kept in TRANS_CHECK_MAX_TIME_TOPIC)
    transactionTimeOut: int = 6000
    transactionCheckMax: int = 15
    transactionCheckInterval: int = 30_000
    # a commit's op record waits to be batched with others: written when its body (the halves'
    # queue offsets) reaches transactionOpMsgMaxSize bytes or transactionOpBatchInterval ms
    # after the first (a rollback's op is written at once)
    transactionOpMsgMaxSize: int = 4096
    transactionOpBatchInterval: int = 3000
    timerStopEnqueue: bool = False  # pause putting timer messages on the wheel
    timerStopDequeue: bool = False  # pause deliveries
    mappedFileSizeTimerLog: int = 100 * 1024 * 1024
    maxHashSlotNum: int = 5_000_000
    maxIndexNum: int = 20_000_000
    messageIndexEnable: bool = True
    autoCreateTopicEnable: bool = True
    defaultTopicQueueNums: int = 8  # RocketMQ BrokerConfig default
    # a PULL or POP of a group not in subscriptionGroup.json makes its entry (off: refused)
    autoCreateSubscriptionGroup: bool = True
    # request serving
    longPollingMaxMs: int = 30_000
    # SQL92 subscriptions over message properties (RocketMQ's name and default: off; a
    # consumer asking for one is refused until it is on). Tag subscriptions need nothing.
    enablePropertyFilter: bool = False
    maxInflightRequests: int = 10_000
    maxFrameBytes: int = 8 * 1024 * 1024
    maxBatchCount: int = 4096
    # the client port's budget, for all its peers together (common/broker/tcp_port.py)
    clientMaxConnections: int = 4096  # more are closed as they are accepted
    clientPeerBufferBytes: int = 16 * 1024 * 1024  # unread answers before a peer's requests wait
    clientBufferBytes: int = 256 * 1024 * 1024  # every peer's; past it the largest is closed
    # security (docs/security.md): CURVE on the client and HA ports, the ACL per request
    aclEnable: bool = False
    aclFile: str = ""  # RocketMQ ACL 1.0's plain_acl.yml shape, with curvePublicKey
    curveSecretKeyFile: str = ""  # this broker's .key_secret (both ports; its HA client too)
    # a slave pins its master's public key (.key); empty: this broker's own public key (the
    # group shares one key pair)
    haMasterPublicKeyFile: str = ""
    aclReloadIntervalMs: int = 5000  # the ACL file is polled (ctime, then sha256) this often
    curveHandshakeTimeoutMs: int = 5000  # ZMQ_HANDSHAKE_IVL: a slow handshake is cut then

    # ---- derived values -------------------------------------------------------------------
    @property
    def ha_port(self) -> int:
        return self.haListenPort or self.listenPort + 1

    @property
    def ha_bind_host(self) -> str:
        return self.haBindAddress or "0.0.0.0"

    @property
    def metrics_bind_host(self) -> str:
        if self.metricsBindAddress:
            return self.metricsBindAddress
        return "127.0.0.1" if self.aclEnable else "0.0.0.0"

    @property
    def store_root(self) -> Path:
        return Path(os.path.expanduser(self.storePathRootDir))

    @property
    def is_slave(self) -> bool:
        return self.brokerRole == "SLAVE"

    @property
    def sync_flush(self) -> bool:
        return self.flushDiskType == "SYNC_FLUSH"

    @property
    def client_address(self) -> str:
        return f"{self.brokerIP1}:{self.listenPort}"

    def store_host_ip(self) -> str:
        """The IPv4 address STOREHOST (so every msgId) carries: ``brokerIP1`` itself when it is
        one, else the first IPv4 address the hostname resolves to (in a container brokerIP1 is
        the service name). Resolved once, when the store starts; ``brokerIP1`` stays as given
        in the addresses clients and slaves connect to. ConfigError naming the key when it
        resolves to no IPv4 address: a record must never carry 0.0.0.0."""
        return resolve_ipv4(self.brokerIP1, "brokerIP1")

    def validate(self) -> None:
        """Cross-field checks; raises ConfigError naming the key."""
        _require(self.brokerRole in ROLES, "brokerRole", f"must be one of {', '.join(ROLES)}")
        _require(self.flushDiskType in FLUSH_TYPES, "flushDiskType", f"must be one of {FLUSH_TYPES}")
        _require(self.brokerId <= 255, "brokerId", "must be <= 255 (it names the epochs the "
                 "broker opens when promoted)")
        if self.enableControllerMode:
            self._validate_controller()
        elif self.brokerRole == "SLAVE":
            _require(self.brokerId > 0, "brokerId", "a SLAVE needs brokerId > 0")
        else:
            _require(self.brokerId == 0, "brokerId", "a master has brokerId 0")
        _require(self.mappedFileSizeCommitLog >= 4096, "mappedFileSizeCommitLog", "must be >= 4096")
        _require(
            self.mappedFileSizeConsumeQueue >= 20 and self.mappedFileSizeConsumeQueue % 20 == 0,
            "mappedFileSizeConsumeQueue",
            "must be a positive multiple of 20",
        )
        _require(self.maxMessageSize > 0, "maxMessageSize", "must be > 0")
        _require(self.enabledAppendPropCRC or not self.forceVerifyPropCRC, "forceVerifyPropCRC",
                 "needs enabledAppendPropCRC: true (records without the CRC would be cut)")
        _require(self.inSyncReplicas >= 1, "inSyncReplicas", "must be >= 1")
        _require(self.slaveConfigSyncIntervalMs >= 0, "slaveConfigSyncIntervalMs", "must be >= 0")
        _require(0 < self.diskMaxUsedSpaceRatio <= 95, "diskMaxUsedSpaceRatio", "must be in 1..95")
        _require(self.maxHashSlotNum > 0 and self.maxIndexNum > 1, "maxIndexNum", "must be > 1")
        for key in ("clientMaxConnections", "clientPeerBufferBytes"):
            _require(getattr(self, key) > 0, key, "must be > 0")
        _require(self.clientBufferBytes >= self.clientPeerBufferBytes, "clientBufferBytes",
                 "must be >= clientPeerBufferBytes (one peer's share)")
        for key in ("listenPort", "haListenPort", "metricsPort", "grpcServerPort"):
            _require(0 <= getattr(self, key) <= 65535, key, "must be a port number")
        _require(bool(self.tlsCertPath) == bool(self.tlsKeyPath),
                 "tlsKeyPath" if self.tlsCertPath else "tlsCertPath",
                 "TLS on the gRPC port needs both tlsCertPath and tlsKeyPath")
        if self.grpcServerPort and self.aclEnable:
            _require(bool(self.tlsCertPath), "tlsCertPath", "with aclEnable the gRPC port runs "
                     "TLS only (the signatures must not travel in the clear): give "
                     "tlsCertPath and tlsKeyPath")
            _require(bool(self.grpcClientKeyFile), "grpcClientKeyFile", "with aclEnable the "
                     "gRPC front end reaches the brokers with a key of its own (an admin "
                     "account's .key_secret)")
        for key in ("haBindAddress", "metricsBindAddress", "grpcBindAddress"):
            _require(_is_ipv4_or_empty(getattr(self, key)), key,
                     "must be an IPv4 address of this host (0.0.0.0: every interface), or empty")
        _require(0 < self.haTransferBatchSize <= HA_MAX_TRANSFER_BATCH, "haTransferBatchSize",
                 f"must be in 1..{HA_MAX_TRANSFER_BATCH} (every slave accepts DATA frames up "
                 "to that, whatever its own setting)")
        _require(self.maxHaTransferByteInSecond >= 100 * self.haTransferBatchSize,
                 "maxHaTransferByteInSecond", "must be >= 100 x haTransferBatchSize (it is "
                 "enforced per 10 ms)")
        parse_delay_levels(self.messageDelayLevel)
        precision = self.timerPrecisionMs
        _require(100 <= precision <= 60_000 and (1000 % precision == 0 or precision % 1000 == 0),
                 "timerPrecisionMs", "must be 100..60000 ms, a divisor or a multiple of a second")
        _require(self.timerMaxDelaySec >= 1, "timerMaxDelaySec", "must be >= 1")
        _require(1 <= self.timerRollWindowSlot < 2 * TIMER_WHEEL_TICKS, "timerRollWindowSlot",
                 f"must be in 1..{2 * TIMER_WHEEL_TICKS - 1} (the wheel's two spans)")
        _require(self.timerFlushIntervalMs >= 10, "timerFlushIntervalMs", "must be >= 10")
        _require(self.timerCongestNumEachSlot >= 1, "timerCongestNumEachSlot", "must be >= 1")
        _require(self.transactionTimeOut >= 0, "transactionTimeOut", "must be >= 0")
        _require(self.transactionCheckMax >= 1, "transactionCheckMax", "must be >= 1")
        _require(self.transactionCheckInterval >= 10, "transactionCheckInterval",
                 "must be >= 10")
        _require(16 <= self.transactionOpMsgMaxSize <= 1_048_576, "transactionOpMsgMaxSize",
                 "must be 16..1048576 bytes")
        _require(self.transactionOpBatchInterval >= 1, "transactionOpBatchInterval",
                 "must be >= 1 ms")
        _require(self.mappedFileSizeTimerLog >= 52 * 16 + 16, "mappedFileSizeTimerLog",
                 "must hold at least 16 units of 52 bytes")
        if self.aclEnable:
            _require(bool(self.curveSecretKeyFile), "curveSecretKeyFile",
                     "aclEnable needs this broker's secret key file (replog keys new NAME)")
            _require(bool(self.aclFile), "aclFile", "aclEnable needs an ACL file")
        _require(self.aclReloadIntervalMs >= 50, "aclReloadIntervalMs", "must be >= 50")
        _require(100 <= self.curveHandshakeTimeoutMs <= 600_000, "curveHandshakeTimeoutMs",
                 "must be in 100..600000")
        if self.groupServers.strip():
            try:
                split_addresses(self.groupServers)
            except ValueError as e:
                _require(False, "groupServers", str(e))


    def _validate_controller(self) -> None:
        _require(self.brokerRole != "SLAVE", "brokerRole", "in controller mode the controller "
                 "picks the master: give SYNC_MASTER or ASYNC_MASTER, the mode this broker runs "
                 "whenever it is elected")
        _require(1 <= self.brokerId <= 255, "brokerId", "in controller mode brokerId is the "
                 "broker's member id in its group, 1..255 (the master answers as brokerId 0)")
        try:
            parse_controller_addr(self.controllerAddr)
        except ValueError as e:
            _require(False, "controllerAddr", str(e))
        _require(1000 <= self.controllerSessionTimeoutMs <= 600_000, "controllerSessionTimeoutMs",
                 "must be in 1000..600000 (ZooKeeper also clamps it to 2..20 tickTimes)")
        lease = self.controller_lease_ms
        _require(100 <= lease < self.controllerSessionTimeoutMs * 2 // 3, "controllerLeaseMs",
                 f"must be 0 (half the session timeout) or in 100..<2/3 of "
                 f"controllerSessionTimeoutMs ({self.controllerSessionTimeoutMs}): a master must "
                 "stop writing before ZooKeeper can expire its session and elect another")
        _require(100 <= self.controllerPollIntervalMs <= 600_000, "controllerPollIntervalMs",
                 "must be in 100..600000")
        _require(self.haMaxTimeSlaveNotCatchup >= self.slaveTimeout, "haMaxTimeSlaveNotCatchup",
                 f"must be >= slaveTimeout ({self.slaveTimeout}): a slave slower than one put's "
                 "wait must not leave the SyncStateSet")
        _require(self.switchoverTimeoutMs >= 100, "switchoverTimeoutMs", "must be >= 100")

    @property
    def controller_lease_ms(self) -> int:
        return self.controllerLeaseMs or self.controllerSessionTimeoutMs // 2


def parse_controller_addr(text: str) -> tuple[str, str]:
    """``host:port[,host:port...][/chroot]`` -> (the hosts as kazoo takes them, the chroot or
    ""); ValueError naming what is wrong."""
    hosts, slash, chroot = text.strip().partition("/")
    if not hosts:
        raise ValueError("controller mode needs the ZooKeeper ensemble: host:port[,host:port]"
                         "[/chroot]")
    split_addresses(hosts)
    if slash:
        parts = chroot.split("/")
        if not chroot or any(not p or p in (".", "..") for p in parts):
            raise ValueError(f"chroot /{chroot!r} is not a ZooKeeper path")
        return hosts, "/" + chroot
    return hosts, ""


def resolve_ipv4(host: str, key: str) -> str:
    """``host`` as dotted IPv4 text: itself if it is one, else its first IPv4 address
    (``socket.getaddrinfo``); ConfigError naming ``key`` when there is none."""
    text = host.strip()
    try:
        if socket.inet_ntoa(socket.inet_aton(text)) == text:  # a literal, never resolved
            return text
    except OSError:
        pass
    if not text:
        raise ConfigError(f"config key {key!r}: empty, it needs a host name or IPv4 address")
    try:
        found = socket.getaddrinfo(text, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"config key {key!r}: {text!r} resolves to no IPv4 address ({e}); "
                          "records carry the broker's IPv4 address in STOREHOST and every "
                          "msgId: give an IPv4 address or a name that resolves to one "
                          "here") from None
    return str(found[0][4][0])


def _is_ipv4_or_empty(text: str) -> bool:
    if not text:
        return True
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def _require(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key!r}: {why}")


_FIELDS = {f.name: f for f in dataclasses.fields(BrokerConfig)}
KNOWN_KEYS = tuple(_FIELDS)


def closest_key(key: str) -> str | None:
    """The known key nearest to ``key`` (case-insensitive), for error messages."""
    lowered = {k.lower(): k for k in KNOWN_KEYS}
    if key.lower() in lowered:
        return lowered[key.lower()]
    match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.5)
    return lowered[match[0]] if match else None


def _coerce(key: str, value: Any, from_text: bool) -> Any:
    """Convert ``value`` to the field's type; text (env, --set) is parsed, YAML must match."""
    kind = _FIELDS[key].type
    if from_text and isinstance(value, str) and kind != "str":
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"config key {key!r}: cannot parse {value!r}: {e}") from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "str":
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # deleteWhen: 04 in YAML is an int
    raise ConfigError(f"config key {key!r}: expected {kind}, got {type(value).__name__} {value!r}")


def _apply(values: dict[str, Any], items: Iterable[tuple[str, Any]], from_text: bool) -> None:
    for key, value in items:
        if key not in _FIELDS:
            hint = closest_key(key)
            raise ConfigError(
                f"unknown config key {key!r}" + (f" (did you mean {hint!r}?)" if hint else "")
            )
        values[key] = _coerce(key, value, from_text)


def parse_overrides(pairs: Iterable[str]) -> list[tuple[str, str]]:
    """``["k=v", ...]`` from ``--set`` into pairs; a pair without ``=`` is refused."""
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        out.append((key.strip(), value))
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    **fields: Any,
) -> BrokerConfig:
    """Build a validated BrokerConfig from a YAML file, environment and ``--set`` pairs.

    ``fields`` are typed values applied after the file (tests and ``cluster up`` use them).
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping of key: value")
        _apply(values, ((str(k), v) for k, v in raw.items()), from_text=False)
    _apply(values, fields.items(), from_text=False)
    env = os.environ if env is None else env
    # REPLOG_<key> for a config key (camelCase, as in broker.conf); upper-case names
    # (REPLOG_DEMO_DURATION, REPLOG_BENCH_SCALE...) are the tools' own settings, not keys
    env_items = [(k[len("REPLOG_") :], v) for k, v in env.items()
                 if k.startswith("REPLOG_") and not k[len("REPLOG_") :].isupper()]
    _apply(values, env_items, from_text=True)
    _apply(values, parse_overrides(overrides), from_text=True)
    cfg = BrokerConfig(**values)
    cfg.validate()
    return cfg


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def split_addresses(servers: str | Iterable[str]) -> list[str]:
    """``host:port[,host:port...]`` (or a list of them) -> the addresses; ValueError naming
    the first one that is not host:port, or that there is none."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s.strip()]
    for s in out:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"server {s!r} is not host:port")
    if not out:
        raise ValueError("no servers given")
    return out


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m"`` -> ``[1000, 5000, 60000]`` (ms); level L is element L-1."""
    levels = []
    for word in text.split():
        unit = word[-1:]
        number = word[:-1]
        if unit not in _UNITS_MS or not number.isdigit() or int(number) <= 0:
            raise ConfigError(f"config key 'messageDelayLevel': bad level {word!r}")
        levels.append(int(number) * _UNITS_MS[unit])
    if not levels:
        raise ConfigError("config key 'messageDelayLevel': no levels")
    return levels


def dump_yaml(cfg: BrokerConfig) -> str:
    """The config as YAML (what ``cluster up`` writes for each child broker)."""
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)
