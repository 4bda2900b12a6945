#!/usr/bin/env bash
# Run a measurement matrix on a GPU machine (the device tool: no network there).
#
#   bash benchmarks/run_campaign.sh [MATRIX] [OUT]
#
# defaults: benchmarks/matrices/campaign1.yaml -> benchmarks/measurements/<gpu>-campaign1.jsonl
# Installs nothing from the network. The device image has torch, transformers, peft, accelerate,
# nvidia-ml-py and pyyaml; bitsandbytes (QLoRA, 8-bit optimizers) is NOT there: carry its wheel
# in .whl/ (see /work/.library/device/README.md), e.g. here:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 -d .whl bitsandbytes==0.50.2
# and call the device tool with carry: [".whl"] and command: bash benchmarks/run_campaign.sh
# The records are appended (crash-safe, resumable) and copied to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
MATRIX="${1:-benchmarks/matrices/campaign1.yaml}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
GPU=$(python3 -c "
import torch
from ftplan.catalog.gpus import resolve_gpu_name
n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'
try:
    print(resolve_gpu_name(n))
except Exception:
    print(n.lower().replace(' ', '-'))" 2>/dev/null || echo unknown)
NAME=$(basename "$MATRIX"); NAME="${NAME%.*}"
OUTFILE="${2:-benchmarks/measurements/${GPU}-${NAME}.jsonl}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# CAMPAIGN_TIMEOUT_S: stop the matrix in time for the copy to $OUT (the device kills the whole call)
if [ -n "${CAMPAIGN_TIMEOUT_S:-}" ]; then TO=(timeout --signal=INT "$CAMPAIGN_TIMEOUT_S"); else TO=(); fi
"${TO[@]}" python3 -m ftplan.cli measure --matrix "$MATRIX" --out "$OUTFILE"
rc=$?
python3 -m ftplan.cli validate "$OUTFILE" --skip-bad || true
if [ -n "${OUT:-}" ]; then cp "$OUTFILE" "$OUT/" ; fi
exit $rc
