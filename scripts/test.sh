#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, checks the Rust and
# Python sources, builds the wheel users get (scripts/build-wheel.sh), installs it into a
# fresh virtualenv with no Rust toolchain on PATH, and runs pytest there against the real
# Intel compilers and driver, so a file missing from the wheel fails the run. Any failure
# fails the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

source scripts/prereqs.sh

echo "== cargo fmt / clippy / test" >&2
cargo fmt --check
cargo clippy --quiet --all-targets -- -D warnings
cargo clippy --quiet --all-targets --features python -- -D warnings
cargo test --quiet

echo "== wheel" >&2
wheel="$(bash scripts/build-wheel.sh | tail -n 1)"

echo "== fresh virtualenv with the wheel, no Rust on PATH" >&2
VENV="$ROOT/.test-venv"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "${wheel}[test,docs]" >/dev/null
NO_RUST_PATH="$VENV/bin:$(tr ':' '\n' <<<"$PATH" | grep -v -e '\.cargo' -e 'rustup' | paste -sd: -)"
if PATH="$NO_RUST_PATH" command -v cargo >/dev/null 2>&1; then
  echo "test: cargo is still on PATH for the installed-wheel tests" >&2
  exit 1
fi

echo "== ruff" >&2
PATH="$NO_RUST_PATH" ruff check python tests benches scripts docs
PATH="$NO_RUST_PATH" ruff format --check python tests benches scripts docs

echo "== pytest on the installed wheel (real ocloc: $(command -v ocloc) and $XPU_ZEBIN_MODERN_OCLOC)" >&2
# pytest exits 5 when it collected no tests: set -e turns that into a failure too.
PATH="$NO_RUST_PATH" XPU_ZEBIN_EXPECT_INSTALLED="$VENV" "$VENV/bin/python" -m pytest tests \
  --durations=15
