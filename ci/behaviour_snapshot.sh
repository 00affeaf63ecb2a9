#!/usr/bin/env bash
# Writes the outputs a refactor must leave unchanged into OUT (a folder):
# bench_decide's decision digest and the simulator's cells (one node, a link
# sweep, the cluster), each as JSON with the timing fields removed.
# Usage: bash ci/behaviour_snapshot.sh OUT [TRACE]   (TRACE: a `kvtier bench trace` file;
# without one the Mooncake cells are left out)
set -euo pipefail
out=${1:?usage: ci/behaviour_snapshot.sh OUT [TRACE]}
trace=${2:-}
mkdir -p "$out"
strip() {  # drop wall-clock fields, keep every decision and outcome
  python3 -c '
import json, sys
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in sorted(x.items())
                if not any(w in k for w in ("wall", "elapsed", "_us", "seconds_taken", "runtime_s", "machine"))}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
print(json.dumps(clean(json.load(sys.stdin)), indent=1, sort_keys=True))'
}
python3 -m kvtier.bench.bench_decide --trajectories 2000 --pauses 6000 --no-reference --json \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"actions": d["actions"], "decisions_sha256": d["decisions_sha256"]}, indent=1, sort_keys=True))' \
  > "$out/bench_decide.json"
python3 -m kvtier.bench.bench_decide --trajectories 2000 --pauses 6000 --no-reference --admission-wait-s 0.5 --json \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"actions": d["actions"], "decisions_sha256": d["decisions_sha256"]}, indent=1, sort_keys=True))' \
  > "$out/bench_decide_admission.json"
for rate in 0.6 0.8; do
  kvtier bench simulate --synth 2000 --rate $rate --link-gbps 25 --json | strip > "$out/sim_synth_${rate}_25.json"
done
kvtier bench simulate --synth 600 --rate 0.6 --nodes 4 --router least-loaded --remote-gbps 25 --json | strip > "$out/sim_cluster.json"
if [ -n "$trace" ]; then
  kvtier bench simulate --trace "$trace" --sweep-link 25,50 --json | strip > "$out/sim_mc_sweep.json"
  kvtier bench simulate --trace "$trace" --link-gbps 25 --jitter 3 --json | strip > "$out/sim_mc_jitter.json"
fi
echo "snapshot written to $out"
