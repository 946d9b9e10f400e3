#!/usr/bin/env bash
# Rerun the benchmarks whose outputs docs/accuracy.md quotes, one at a time, and save each output with its
# command on the first line: bash scripts/refresh_benchmarks.sh [NAME ...] (default: every docs/benchmarks/*.txt).
# The command of each file is read from its own first line ("$ python -m tests.benchmarks.NAME ARGS").
# Afterwards run `.venv/bin/python -m pytest -q tests/test_docs_accuracy.py` and update the quoted figures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in docs/benchmarks/*.txt; do names+=("$(basename "$f" .txt)"); done
fi
for name in "${names[@]}"; do
    out="docs/benchmarks/$name.txt"
    cmd=$(head -n 1 "$out")
    case "$cmd" in
        '$ python -m tests.benchmarks.'*) ;;
        *) echo "$out: first line is not a benchmark command: $cmd" >&2; exit 2 ;;
    esac
    read -r -a argv <<< "${cmd#\$ python }"
    echo "== $name: ${cmd#\$ }" >&2
    start=$(date +%s)
    { echo "$cmd"; "$PY" "${argv[@]}" 2>&1; } > "$out.new"
    mv "$out.new" "$out"
    echo "   $(( $(date +%s) - start )) s" >&2
done
