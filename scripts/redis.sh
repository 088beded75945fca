#!/usr/bin/env bash
# Prints the path of a redis-server for the cache tests, which start it themselves on
# loopback ports of their own (tests/common/redis.rs). It is Debian's server binary,
# from the redis-tools package: Debian's redis-server package adds to it only a symlink
# and a service that its installation would start on port 6379 and leave running. Installs
# redis-tools with apt-get when missing, and links the binary under the name it serves by.
set -euo pipefail
ROOT=${REDIS_CACHE:-/var/tmp/tiergate-redis}
if [ ! -x /usr/bin/redis-check-rdb ]; then
  "$(dirname "$0")/apt-install.sh" redis-tools
fi
mkdir -p "$ROOT/bin"
# One binary is redis-server, redis-check-rdb and redis-check-aof, by the name it runs as.
ln -sf /usr/bin/redis-check-rdb "$ROOT/bin/redis-server"
echo "$ROOT/bin/redis-server"
