#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh: the real Intel toolchains, a
# virtualenv in .venv, and this package built from source (maturin) into it. Idempotent.
# Usage: source scripts/setup.sh [pip extras, e.g. test]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo (Rust) is required to build xpu-zebin; install it with rustup" >&2
  exit 1
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi

# Both real compilers: Debian's ocloc on PATH, and the modern one behind a wrapper.
XPU_ZEBIN_MODERN_OCLOC="$(bash "$ROOT/scripts/install-toolchain.sh" | tail -n 1)"
export XPU_ZEBIN_MODERN_OCLOC

VENV="$ROOT/.venv"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
extras="${1:-}"
target="."
[ -z "$extras" ] || target=".[${extras}]"
echo "setup: building and installing xpu-zebin ($target) into $VENV" >&2
# pip always rebuilds a local project, so the installed module matches this checkout.
"$VENV/bin/python" -m pip install -q "$target" >/dev/null
export PATH="$VENV/bin:$PATH"
