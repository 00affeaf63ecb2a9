#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs them.
#  - the servers the remote-tier tests start on loopback (redis-server, from Debian, when root),
#    and libibverbs1, which the Mooncake wheel's libraries link against even without RDMA
#  - kvtier with every CPU extra, torch pinned to the CPU wheel
#  - the engine packages, without their dependencies (they pin a CUDA torch)
#  - the live-engine environment (ci/live-env.sh: vLLM's CPU build), where tests/live run against a
#    running vLLM engine; a live test that cannot run there fails (KVTIER_LIVE_REQUIRED=1)
# Arguments go to the main test run (e.g. `bash ci/test.sh -x tests/test_store.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
need=""
command -v redis-server >/dev/null 2>&1 || need="redis-server"
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1' || need="$need libibverbs1"
if [ "$(id -u)" = 0 ] && [ -n "$need" ] && command -v apt-get >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null) \
        || echo "ci/test.sh: could not install$need; the Redis/Mooncake tests will skip" >&2
fi
python3 -m pip install -q torch==2.13.0 -e '.[all]'
python3 -m pip install -q --no-deps -r ci/requirements-engines.txt
# PYTHONSAFEPATH: the repository root is not put on sys.path, so the tests import
# the installed `kvtier` package, never the source folders as top-level modules.
main=0
PYTHONSAFEPATH=1 python3 -m pytest -q --ignore=tests/live "$@" || main=$?
live=0
if [ "$#" -eq 0 ]; then
    venv="$(bash ci/live-env.sh)"
    PYTHONSAFEPATH=1 KVTIER_LIVE_REQUIRED=1 "$venv/bin/python" -m pytest -q tests/live || live=$?
fi
if [ "$main" -ne 0 ] || [ "$live" -ne 0 ]; then
    echo "ci/test.sh: main tests exit $main, live-engine tests exit $live" >&2
    exit 1
fi
