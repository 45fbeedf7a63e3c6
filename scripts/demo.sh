#!/usr/bin/env bash
# The main job, on a fresh machine: install the real Intel compilers, build xpu-zebin, then
# compile a generated kernel that overflows per-thread scratch space (PTSS) in default GRF
# mode, and show the automatic large-GRF fallback at work.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
xpu-zebin -v demo --ocloc "$XPU_ZEBIN_MODERN_OCLOC" "$@"
