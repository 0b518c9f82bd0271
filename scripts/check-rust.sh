#!/usr/bin/env bash
# Finds a Rust toolchain that builds pressrun's FLUTE binding (native/pressrun-flute,
# over the crate flute 1.11.7, which needs rustc 1.88 or later): a rustup one in
# ~/.cargo/bin first (kept when it is there), then cargo and rustc on PATH (Debian
# bookworm's rustc-web/cargo-web 1.96 from bookworm-security, which
# scripts/setup-system.sh installs; Debian's own rustc, 1.63, is too old).
#
#   check-rust.sh           prints the toolchain found, or what to do; exit 1 if none
#   check-rust.sh --dir     prints only the folder holding that cargo and rustc
#   check-rust.sh --quiet   prints nothing; the exit status alone says
set -euo pipefail
need_major=1
need_minor=88
mode=${1:-}

new_enough() {  # new_enough RUSTC: its version is need_major.need_minor or later
  local version major rest minor
  version=$("$1" --version 2>/dev/null | awk '{print $2}') || return 1
  [ -n "$version" ] || return 1
  major=${version%%.*}
  rest=${version#*.}
  minor=${rest%%.*}
  [ "$major" -gt "$need_major" ] || { [ "$major" -eq "$need_major" ] && [ "$minor" -ge "$need_minor" ]; }
}

candidates=("$HOME/.cargo/bin")
if path_rustc=$(command -v rustc 2>/dev/null); then
  candidates+=("$(dirname "$path_rustc")")
fi
candidates+=(/usr/bin)
found=()
for dir in "${candidates[@]}"; do
  if [ -x "$dir/rustc" ]; then
    found+=("$dir/rustc ($("$dir/rustc" --version 2>/dev/null | awk '{print $2}'))")
    if [ -x "$dir/cargo" ] && new_enough "$dir/rustc"; then
      case "$mode" in
        --dir) echo "$dir" ;;
        --quiet) ;;
        *) echo "check-rust: $("$dir/cargo" --version), $("$dir/rustc" --version) in $dir" ;;
      esac
      exit 0
    fi
  fi
done
if [ "$mode" != --quiet ]; then
  seen=${found[*]:-none}
  echo "check-rust: no cargo with rustc ${need_major}.${need_minor} or later (found: $seen);" \
    "\`make setup\` as root installs Debian's rustc-web and cargo-web from bookworm-security" \
    "(scripts/setup-system.sh), or install Rust ${need_major}.${need_minor}+ with rustup" \
    "into ~/.cargo/bin" >&2
fi
exit 1
