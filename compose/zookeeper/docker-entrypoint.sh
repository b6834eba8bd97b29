#!/bin/bash
# Entrypoint of zookeeper:3.8 built by compose/offline-images.sh: the official image's
# docker-entrypoint.sh (same variables, same zoo.cfg), but the server is Debian's jars run
# directly instead of zkServer.sh:
#   java -cp $ZOO_CONF_DIR:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar:\
#            /usr/share/java/servlet-api.jar \
#        org.apache.zookeeper.server.quorum.QuorumPeerMain $ZOO_CONF_DIR/zoo.cfg
# (zookeeper.jar's manifest names its other jars; slf4j-simple logs to stdout; the servlet
# API is what the AdminServer on :8080 needs beyond them.)
# QuorumPeerMain runs a standalone server when ZOO_SERVERS names one server (and
# ZOO_STANDALONE_ENABLED=true), else a quorum peer with id ZOO_MY_ID.
# Variables: ZOO_MY_ID (default 1), ZOO_SERVERS (default "server.1=localhost:2888:3888;2181"),
# ZOO_TICK_TIME, ZOO_INIT_LIMIT, ZOO_SYNC_LIMIT, ZOO_AUTOPURGE_PURGEINTERVAL,
# ZOO_AUTOPURGE_SNAPRETAINCOUNT, ZOO_MAX_CLIENT_CNXNS, ZOO_STANDALONE_ENABLED,
# ZOO_ADMINSERVER_ENABLED, ZOO_4LW_COMMANDS_WHITELIST, ZOO_CFG_EXTRA (space-separated
# key=value lines), JVMFLAGS / SERVER_JVMFLAGS, ZK_SERVER_HEAP (MB, default 1000),
# ZOO_LOG_LEVEL (trace|debug|info|warn|error, default info).
# A zoo.cfg mounted at $ZOO_CONF_DIR/zoo.cfg is used as it is; a myid already in the data
# dir is kept.
set -euo pipefail

# Started as root (the default): own the data dirs, then run as zookeeper. Started with
# --user, run as that user.
if [[ "${1:-}" = zkServer.sh && "$(id -u)" = 0 ]]; then
    mkdir -p "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR" "$ZOO_CONF_DIR"
    chown -R zookeeper:zookeeper "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR"
    chown zookeeper:zookeeper "$ZOO_CONF_DIR" 2>/dev/null || true
    exec gosu zookeeper "$0" "$@"
fi

if [[ "${1:-}" != zkServer.sh ]]; then
    exec "$@"    # e.g. docker run -it zookeeper:3.8 bash, or zkCli.sh
fi
if [[ "${2:-start-foreground}" != start-foreground ]]; then
    echo "this image runs only 'zkServer.sh start-foreground'" >&2
    exit 2
fi

CONFIG="$ZOO_CONF_DIR/zoo.cfg"
if [[ ! -f "$CONFIG" ]]; then
    {
        echo "dataDir=$ZOO_DATA_DIR"
        echo "dataLogDir=$ZOO_DATA_LOG_DIR"
        echo "tickTime=$ZOO_TICK_TIME"
        echo "initLimit=$ZOO_INIT_LIMIT"
        echo "syncLimit=$ZOO_SYNC_LIMIT"
        echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
        echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
        echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
        echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
        echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
        for server in ${ZOO_SERVERS:-server.1=localhost:2888:3888;2181}; do
            echo "$server"
        done
        if [[ -n "${ZOO_4LW_COMMANDS_WHITELIST:-}" ]]; then
            echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST"
        fi
        for cfg_extra_entry in ${ZOO_CFG_EXTRA:-}; do
            echo "$cfg_extra_entry"
        done
    } >"$CONFIG"
fi

if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
    echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi

# shellcheck disable=SC2086  # JVMFLAGS are several words
exec java \
    -Xmx"${ZK_SERVER_HEAP:-1000}"m ${SERVER_JVMFLAGS:-} ${JVMFLAGS:-} \
    -Dzookeeper.log.dir="$ZOO_LOG_DIR" \
    -Dorg.slf4j.simpleLogger.defaultLogLevel="${ZOO_LOG_LEVEL:-info}" \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd HH:mm:ss,SSS" \
    -Dorg.slf4j.simpleLogger.logFile=System.out \
    -cp "$ZOO_CONF_DIR:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar:/usr/share/java/servlet-api.jar" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$CONFIG"
