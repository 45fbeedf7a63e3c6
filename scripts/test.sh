#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, then runs the Rust and
# Python checks and tests against the real Intel compilers. Any failure fails the run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" test

echo "== cargo fmt / clippy / test" >&2
cargo fmt --check
cargo clippy --quiet --all-targets -- -D warnings
cargo clippy --quiet --all-targets --features python -- -D warnings
cargo test --quiet

echo "== ruff" >&2
ruff check python tests benches
ruff format --check python tests benches

echo "== pytest (real ocloc: $(command -v ocloc) and $XPU_ZEBIN_MODERN_OCLOC)" >&2
# pytest exits 5 when it collected no tests: set -e turns that into a failure too.
python -m pytest tests
