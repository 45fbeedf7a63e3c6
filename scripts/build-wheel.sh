#!/usr/bin/env bash
# Build what a package index accepts: a manylinux_2_28 abi3 wheel (maturin, linking against
# glibc 2.28 through zig, so RHEL 8 / Ubuntu 20.04 and newer can install it) and an sdist,
# into dist/. Then check the wheel with auditwheel: the manylinux tag, and no external
# libraries (Level Zero and libocloc are opened at run time, never linked).
# Prints the wheel's path on its last line. Idempotent; installs its tools in .build-venv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PLATFORM="manylinux_2_28"
BUILD_VENV="$ROOT/.build-venv"

PREREQS_NO_TOOLCHAIN=1 source scripts/prereqs.sh
[ -x "$BUILD_VENV/bin/python" ] || python3 -m venv "$BUILD_VENV"
# zig is maturin's cross linker for an older glibc; auditwheel checks the result. pip
# installs uv, uv the rest (12 s against 24 s by pip alone); uv also makes scripts/test.sh's
# virtualenv. Where uv fails (it reads no pip.conf), pip does its job, slower.
TOOLS=("maturin>=1.7,<2" ziglang auditwheel)
"$BUILD_VENV/bin/python" -m pip install -q "uv>=0.13,<0.14" >/dev/null
source scripts/uv-env.sh
if ! env "${UV_ENV[@]}" "$BUILD_VENV/bin/uv" pip install --quiet --python "$BUILD_VENV/bin/python" \
  "${TOOLS[@]}" >&2; then
  echo "build-wheel: uv could not install the build tools (above); pip installs them instead" >&2
  "$BUILD_VENV/bin/python" -m pip install -q "${TOOLS[@]}" >/dev/null
fi

# maturin finds zig through the Python on PATH (the ziglang package).
export PATH="$BUILD_VENV/bin:$PATH"
rm -rf dist
echo "build-wheel: maturin build --zig --compatibility $PLATFORM" >&2
"$BUILD_VENV/bin/maturin" build --release --zig --compatibility "$PLATFORM" --out dist >&2
"$BUILD_VENV/bin/maturin" sdist --out dist >&2

wheel="$(ls dist/*.whl)"
report="$("$BUILD_VENV/bin/auditwheel" show "$wheel")"
echo "$report" >&2
flat="$(tr -s '\n ' '  ' <<<"$report")"
case "$wheel" in
  *-cp39-abi3-"$PLATFORM"_x86_64.whl) ;;
  *) echo "build-wheel: $wheel is not an abi3 $PLATFORM wheel" >&2; exit 1 ;;
esac
if ! grep -q "consistent with the following platform tag: \"${PLATFORM}_x86_64\"" <<<"$flat"; then
  echo "build-wheel: auditwheel does not accept $wheel as $PLATFORM" >&2
  exit 1
fi
if grep -qE "external shared libraries are required|lib(ze_loader|ze_intel_gpu|ocloc)" <<<"$flat"; then
  echo "build-wheel: the extension links libraries it must open at run time" >&2
  exit 1
fi
echo "$ROOT/$wheel"
