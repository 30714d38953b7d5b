#!/usr/bin/env bash
# The GPU check as one command (see gpu_check.py): no network; about 5-7 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg
exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
