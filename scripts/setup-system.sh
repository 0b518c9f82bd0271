#!/usr/bin/env bash
# Installs the system programs pressrun's tests, benchmarks and demo start:
# nginx (the static-serving reference in bench/), redis-server (shared tracker
# state), aria2c (a third-party BitTorrent client in the swarm tests).
# Idempotent: does nothing when they are already there.
set -euo pipefail
need=()
command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v aria2c >/dev/null 2>&1 || need+=(aria2)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: missing ${need[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "setup-system: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts the services on install; pressrun starts its own on demand.
systemctl disable --now nginx redis-server >/dev/null 2>&1 || true
service nginx stop >/dev/null 2>&1 || true
service redis-server stop >/dev/null 2>&1 || true
