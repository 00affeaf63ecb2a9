#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs them.
#  - the servers the remote-tier tests start on loopback (redis-server, from Debian, when root),
#    and libibverbs1, which the Mooncake wheel's libraries link against even without RDMA
#  - kvtier with every CPU extra, torch pinned to the CPU wheel
#  - the engine packages, without their dependencies (they pin a CUDA torch)
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
PYTHONSAFEPATH=1 exec python3 -m pytest -q "$@"
