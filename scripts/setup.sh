#!/usr/bin/env bash
# Set-up for scripts/demo.sh (and development): the real Intel toolchains, a
# virtualenv in .venv, and this package built from source (maturin) into it. Idempotent.
# Usage: source scripts/setup.sh [pip extras, e.g. test]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source scripts/prereqs.sh

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
