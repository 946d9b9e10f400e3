#!/usr/bin/env bash
# One-time set-up on a fresh machine with Python 3.11: a virtual environment with the pinned
# requirements, and the sample store built from ../shared/datasets (if present).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -d .venv ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
if [ -d ../shared/datasets ]; then
  .venv/bin/python -m predictor ingest --quiet ../shared/datasets/paper-samples \
      ../shared/datasets/vtrain/ground_truth_single.csv ../shared/datasets/vtrain/allreduce_lut/a100
fi
