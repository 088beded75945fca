#!/usr/bin/env bash
# Installs Debian packages with apt-get, keeping the packages' own services (prometheus,
# alertmanager, redis) from starting: this machine runs only the instances the tests
# start. A policy-rc.d that refuses them is put in place for the install only; one
# already there stays. Everything it prints goes to stderr.
#
#   scripts/apt-install.sh PACKAGE...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/apt-install.sh PACKAGE..." >&2; exit 2; }
echo "installing $* (Debian packages)" >&2
own_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  own_policy=1
fi
trap 'if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
