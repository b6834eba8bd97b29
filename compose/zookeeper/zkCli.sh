#!/bin/sh
# ZooKeeper's command-line client, e.g. docker exec zk1 zkCli.sh -server localhost:2181 ls /
exec java -Dorg.slf4j.simpleLogger.defaultLogLevel="${ZOO_LOG_LEVEL:-warn}" \
    -cp "${ZOO_CONF_DIR:-/conf}:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar" \
    org.apache.zookeeper.ZooKeeperMain "$@"
