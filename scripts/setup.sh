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
  # one transaction per line; exit 2 (set-up stops) if anything in these published sets is rejected
  .venv/bin/python -m predictor ingest --quiet ../shared/datasets/paper-samples \
      ../shared/datasets/vtrain/ground_truth_single.csv ../shared/datasets/vtrain/allreduce_lut/a100
  # published multi-node runs (llm-foundry, BLOOM) as measured runs; rows without a needed field are
  # skipped and counted per source, which is not a failure
  .venv/bin/python -m predictor ingest --quiet ../shared/datasets/published-runs
else
  echo "setup: ../shared/datasets not found (looked in $(cd .. && pwd)/shared/datasets): the sample store gets" \
       "only this machine's CPU samples - no paper samples, vTrain or published runs, so the A100 / GH200" \
       "platforms have no measured models to retrain and the tests that need those data sets are skipped." >&2
fi
# the project's own measurements of this machine's CPU (bench/ samples and HF training runs)
.venv/bin/python -m predictor ingest --quiet bench/samples/cpu-2t bench/samples/cpu-1t \
    bench/samples/e2e/cpu-2t-runs.csv bench/samples/e2e/cpu-1t-runs.csv || echo "setup: CPU samples not ingested" >&2
# Browser tests of the dashboard (tests/browser) drive Debian's chromium through the playwright package
# (never `playwright install`: no browser downloads). Install it when root and missing; never fail set-up.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
      || echo "setup: could not install chromium; the browser tests will be skipped" >&2
  else
    echo "setup: no chromium (Debian package 'chromium', installed as root); the browser tests will be skipped" >&2
  fi
fi
