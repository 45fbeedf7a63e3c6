#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, checks the Rust and
# Python sources, builds the wheel users get (scripts/build-wheel.sh), installs it into a
# fresh virtualenv with no Rust toolchain on PATH, and runs pytest there against the real
# Intel compilers and driver, so a file missing from the wheel fails the run. Any failure
# fails the run. It ends with one line per phase, its wall seconds and CPU seconds.
#
#   bash scripts/test.sh                      the gate (.ci/run runs exactly this)
#   bash scripts/test.sh --quick [PYTEST ARGS]
#       the inner loop: cargo fmt and clippy, this checkout built into .venv
#       (scripts/setup.sh), then pytest on what you name (default: every test not marked
#       slow), two at a time. Never a substitute for the gate.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi

PHASES=()
PHASE_NAME=""
PHASE_START=$SECONDS
PHASE_CPU=0
# The CPU seconds (user and system) of every process this script has waited for, its
# children's and theirs: cutime and cstime of this shell ($$, also inside a subshell), in
# clock ticks (pytest runs under scripts/reaper.py, so its orphaned workers count too).
# pytest keeps both cores busy: only less CPU makes it shorter.
TICKS="$(getconf CLK_TCK 2>/dev/null || echo 100)"
children_cpu() {
  local stat
  stat="$(cat "/proc/$$/stat" 2>/dev/null)" || { echo 0; return; }
  # Fields after the command's closing parenthesis: cutime and cstime are the 14th, 15th.
  awk -v ticks="$TICKS" '{ printf "%d", ($14 + $15) / ticks }' <<<"${stat##*) }"
}
phase_ends() {
  [ -z "$PHASE_NAME" ] || PHASES+=("$PHASE_NAME|$((SECONDS - PHASE_START))|$(($(children_cpu) - PHASE_CPU))")
}
phase() { # phase NAME: ends the phase before, starts NAME
  phase_ends
  PHASE_NAME="$1"
  PHASE_START=$SECONDS
  PHASE_CPU="$(children_cpu)"
  echo "== $1" >&2
}
report() {
  local status=$?
  if [ -n "${SCRATCH:-}" ]; then # never ends the report: a mount left there fails rm
    rm -rf --one-file-system -- "$SCRATCH" 2>/dev/null || echo "test: $SCRATCH left behind" >&2
  fi
  phase_ends
  echo "== where the time went (exit status $status): wall seconds, CPU seconds" >&2
  local line name wall cpu
  for line in "${PHASES[@]}"; do
    IFS='|' read -r name wall cpu <<<"$line"
    printf 'phase %-38s %5d s  (CPU %5d s)\n' "$name" "$wall" "$cpu" >&2
  done
  printf 'phase %-38s %5d s  (CPU %5d s)\n' "total" "$SECONDS" "$(children_cpu)" >&2
}
trap report EXIT

phase "prerequisites"
source scripts/prereqs.sh

# The tests' temporary files (caches of thousands of entries, bundles of a GiB) go to
# memory where it has room (a tmpfs /dev/shm with 8 GiB free): on a disk-backed /tmp,
# creating them was most of a cache test's time (15 s against 1 s here). A TMPDIR you set
# is used as it is. Tests about file systems make their own (an XFS image, a FUSE mount).
# The run holds a lock on its directory (.lock), and so do the tests it starts: a directory
# whose lock nobody holds (its owner us) was left by a killed run and is removed here, as
# is one of ours with no lock that has not changed for a day (made before locks). Room
# means free space in the tmpfs and in RAM, which a tmpfs uses: its size is only a limit.
SCRATCH=""
for stale in /dev/shm/xpu-zebin-test.*; do
  [ -d "$stale" ] && [ ! -L "$stale" ] && [ -O "$stale" ] || continue
  if [ -f "$stale/.lock" ] && [ ! -L "$stale/.lock" ]; then
    flock -n "$stale/.lock" true 2>/dev/null || continue # a live run's
  elif [ -z "$(find "$stale" -maxdepth 0 -mmin +1440 2>/dev/null)" ]; then
    continue
  fi
  rm -rf --one-file-system -- "$stale" 2>/dev/null || true
done
ram_kib="$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null || true)"
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = "tmpfs" ] &&
  [ -w /dev/shm ] && [ "$(df --output=avail -k /dev/shm | tail -n 1)" -ge $((8 << 20)) ] &&
  [ "${ram_kib:-0}" -ge $((8 << 20)) ] && command -v flock >/dev/null; then
  SCRATCH="$(mktemp -d /dev/shm/xpu-zebin-test.XXXXXX)"
  exec 9>"$SCRATCH/.lock"
  flock -n 9
  echo "test: temporary files in $SCRATCH (tmpfs)" >&2
fi
in_scratch() { # in_scratch CMD...: CMD with TMPDIR in the scratch directory, if there is one
  if [ -n "$SCRATCH" ]; then TMPDIR="$SCRATCH" "$@"; else "$@"; fi
}

# Both paths run pytest two tests at a time (pytest-xdist; each test keeps its own cache,
# temp dir and servers, tests/conftest.py), handed out a few at a time in the order
# tests/conftest.py gives (tests marked slow first, so neither worker ends on a long test
# while the other idles). A module whose fixtures cost seconds (a Dask cluster, kernels
# found by compiling) runs whole on one worker, so they are made once (tests/conftest.py).
PYTEST_PARALLEL=(-n 2 --dist load)

if [ "$QUICK" = 1 ]; then
  phase "rust checks (fmt, clippy)"
  cargo fmt --check
  cargo clippy --quiet --all-targets --features python -- -D warnings
  phase "build into .venv"
  source scripts/setup.sh test,docs >/dev/null
  phase "ruff"
  ruff check python tests benches scripts docs
  ruff format --check python tests benches scripts docs
  phase "pytest (quick)"
  if [ "$#" -eq 0 ]; then
    set -- tests -m "not slow"
  fi
  in_scratch python3 scripts/reaper.py "$ROOT/.venv/bin/python" -m pytest "${PYTEST_PARALLEL[@]}" \
    --durations=5 "$@"
  exit 0
fi

phase "rust checks (fmt, clippy, cargo test)"
cargo fmt --check
# One clippy, with the Python bindings: only src/lib.rs's `python` module sits behind that
# feature, so it lints every line the build without them has. That build is cargo test's,
# where a rustc warning (dead code without the bindings, say) fails too. Both share one
# setting of flags, so cargo test reuses clippy's build scripts and proc macros; no debug
# info and no incremental state for a build made once (a contributor's own builds keep
# theirs).
# Cargo takes CARGO_ENCODED_RUSTFLAGS over RUSTFLAGS, so the flag joins whichever is set;
# either one replaces a cargo config's build.rustflags (cargo's rule; docs/contributing.md).
(
  if [ -n "${CARGO_ENCODED_RUSTFLAGS+set}" ]; then
    export CARGO_ENCODED_RUSTFLAGS="${CARGO_ENCODED_RUSTFLAGS:+$CARGO_ENCODED_RUSTFLAGS$'\x1f'}-D"$'\x1f'"warnings"
  else
    export RUSTFLAGS="${RUSTFLAGS:-} -D warnings"
  fi
  export CARGO_INCREMENTAL=0
  export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
  cargo clippy --quiet --all-targets --features python -- -D warnings
  in_scratch cargo test --quiet
)

phase "wheel"
wheel="$(bash scripts/build-wheel.sh | tail -n 1)"

phase "virtualenv with the wheel"
# uv (installed by build-wheel.sh) makes the fresh virtualenv and installs the wheel with
# its test and docs extras: the same packages pip would, in seconds. pip's settings reach it
# through scripts/uv-env.sh; where uv fails (it reads no pip.conf), pip does the job, slower.
UV="$ROOT/.build-venv/bin/uv"
VENV="$ROOT/.test-venv"
source scripts/uv-env.sh
rm -rf "$VENV"
if ! { env "${UV_ENV[@]}" "$UV" venv --quiet --python "$(command -v python3)" "$VENV" &&
  env "${UV_ENV[@]}" "$UV" pip install --quiet --python "$VENV/bin/python" "${wheel}[test,docs]"; }; then
  echo "test: uv could not make the virtualenv (above); pip makes it instead" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "${wheel}[test,docs]"
fi
NO_RUST_PATH="$VENV/bin:$(tr ':' '\n' <<<"$PATH" | grep -v -e '\.cargo' -e 'rustup' | paste -sd: -)"
if PATH="$NO_RUST_PATH" command -v cargo >/dev/null 2>&1; then
  echo "test: cargo is still on PATH for the installed-wheel tests" >&2
  exit 1
fi

phase "ruff"
PATH="$NO_RUST_PATH" ruff check python tests benches scripts docs
PATH="$NO_RUST_PATH" ruff format --check python tests benches scripts docs

phase "pytest"
echo "pytest on the installed wheel (real ocloc: $(command -v ocloc) and $XPU_ZEBIN_MODERN_OCLOC)" >&2
# pytest exits 5 when it collected no tests: set -e turns that into a failure too.
# Under scripts/reaper.py: the compile workers a pytest worker leaves behind end on their
# own, and their CPU seconds count in the report.
PATH="$NO_RUST_PATH" XPU_ZEBIN_EXPECT_INSTALLED="$VENV" in_scratch python3 scripts/reaper.py \
  "$VENV/bin/python" -m pytest tests "${PYTEST_PARALLEL[@]}" --durations=15
