#!/usr/bin/env bash
# Installs the system programs pressrun's set-up, tests, benchmarks and demo need:
# python3-venv (the Makefile's venv), a C toolchain and Rust 1.88+ (the FLUTE
# extension: Debian's rustc-web and cargo-web 1.96 from bookworm-security, unless
# scripts/check-rust.sh finds a new enough toolchain, e.g. rustup's in ~/.cargo/bin),
# nginx (the static-serving reference in bench/), redis-server (shared tracker
# state), aria2c (a third-party BitTorrent client in the swarm tests).
# chromium (Debian's, driven headless by the reader's browser tests) and nodejs/npm
# (installs the reader's npm packages from its lockfile).
# Idempotent: does nothing when they are already there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3.11}
need=()
# the set-up itself: the venv, and the FLUTE extension's build (maturin links with cc)
"$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
rust_from_apt=0
if ! "$here/check-rust.sh" --quiet; then
  need+=(rustc-web cargo-web)
  rust_from_apt=1
fi
command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v aria2c >/dev/null 2>&1 || need+=(aria2)
# libfaketime: the tracker's wall-clock step test (tests/tracker/test_tracker_uptime.py), bench/uptime.py's sped clock
command -v faketime >/dev/null 2>&1 || need+=(faketime)
command -v curl >/dev/null 2>&1 || need+=(curl)  # the origin's CLI test, bench/origin_vs_nginx.py
command -v wrk >/dev/null 2>&1 || need+=(wrk)  # bench/origin_vs_nginx.py's load generator
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)  # the emulation's base image
# promtool checks the deployment's Prometheus rules (tests/test_prometheus_rules.py);
# the same Debian package is what the compose file's Prometheus runs
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# the multicast loss test: a network namespace with nftables dropping packets
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
# the web reader: its browser tests and its npm packages
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
# the STUN/TURN server of the reader's WebRTC peers (docker-compose.yml's turn service,
# deploy/coturn/; tests/test_compose.py runs it)
command -v turnserver >/dev/null 2>&1 || need+=(coturn)
# AMT (RFC 7450) wire-format check: Wireshark's AMT dissector decodes the codec's messages
command -v tshark >/dev/null 2>&1 || need+=(tshark)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: missing ${need[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "setup-system: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark's wireshark-common asks whether non-root users may capture: no
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
# no service may start on install: Debian's docker.service would start the engine with
# its defaults, which add NAT rules and set the host's FORWARD policy to DROP
own_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  own_policy=1
fi
trap 'if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt-get -o DPkg::Lock::Timeout=600 update -qq
if [ "$rust_from_apt" = 1 ]; then
  # bookworm's own rustc-web is 1.85; bookworm-security's is 1.96
  candidate=$(apt-cache policy rustc-web | awk '/Candidate:/ {print $2}')
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ] \
      || ! dpkg --compare-versions "$candidate" ge 1.88; then
    echo "setup-system: apt offers rustc-web ${candidate:-(none)}, older than the 1.88 the" \
      "FLUTE extension needs: add bookworm-security to apt's sources (deb" \
      "http://deb.debian.org/debian-security bookworm-security main) and run make again," \
      "or install Rust 1.88+ with rustup into ~/.cargo/bin" >&2
    exit 1
  fi
fi
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts the services on install; pressrun starts its own on demand.
systemctl disable --now nginx redis-server docker docker.socket containerd prometheus coturn \
  >/dev/null 2>&1 || true
service prometheus stop >/dev/null 2>&1 || true
service nginx stop >/dev/null 2>&1 || true
service redis-server stop >/dev/null 2>&1 || true
