#!/usr/bin/env bash
# The GPU check as one command (see gpu_check.py): no network; sized to finish within 8 minutes on one H100/H200
# (not yet timed on a GPU). On CPU: benchmarks/gpu_check.sh --tiny
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg
exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
