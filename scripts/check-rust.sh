#!/usr/bin/env bash
# Checks the Rust toolchain that builds pressrun's FLUTE binding (native/pressrun-flute,
# over the crate flute 1.11.7, which needs rustc 1.88 or later). Debian's packaged
# rustc (1.63 in bookworm) is too old. Prints exactly what to install when it is
# missing or too old; exits 1 then.
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"
need_major=1
need_minor=88
how="install Rust ${need_major}.${need_minor} or later with rustup (https://rustup.rs): \
curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal, \
then run make again (cargo and rustc must be on PATH or in ~/.cargo/bin)"
for tool in cargo rustc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "check-rust: $tool not found; $how" >&2
    exit 1
  fi
done
version=$(rustc --version | awk '{print $2}')
major=${version%%.*}
rest=${version#*.}
minor=${rest%%.*}
if [ "$major" -lt "$need_major" ] || { [ "$major" -eq "$need_major" ] && [ "$minor" -lt "$need_minor" ]; }; then
  echo "check-rust: rustc $version is too old for the flute crate (needs ${need_major}.${need_minor}+); $how" >&2
  exit 1
fi
echo "check-rust: $(cargo --version), rustc $version"
