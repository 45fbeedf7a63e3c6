#!/usr/bin/env bash
# What every script here needs before it builds: cargo, Python's venv, and (unless
# PREREQS_NO_TOOLCHAIN=1) both real Intel compilers, Debian's ocloc on PATH and the modern
# one behind a wrapper, exported as XPU_ZEBIN_MODERN_OCLOC. Idempotent.
# Usage: source scripts/prereqs.sh   (from the repository root)
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "xpu-zebin: cargo (Rust) is required to build xpu-zebin; install it with rustup" >&2
  exit 1
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
# The fleet's store: the tests start their own redis-server on a free port.
# (and openssl, which makes the TLS test's certificate).
if [ "${PREREQS_NO_TOOLCHAIN:-0}" != 1 ] && ! { command -v redis-server && command -v openssl; } >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server openssl >/dev/null
fi
# Cache directories on other file systems: a FUSE mount (libfuse3, fusermount3), XFS
# and btrfs made in loop devices.
if [ "${PREREQS_NO_TOOLCHAIN:-0}" != 1 ] && ! { command -v fusermount3 && command -v mkfs.xfs && command -v mkfs.btrfs; } >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 xfsprogs btrfs-progs >/dev/null
fi
if [ "${PREREQS_NO_TOOLCHAIN:-0}" != 1 ]; then
  XPU_ZEBIN_MODERN_OCLOC="$(bash "$(dirname "${BASH_SOURCE[0]}")/install-toolchain.sh" | tail -n 1)"
  export XPU_ZEBIN_MODERN_OCLOC
fi
