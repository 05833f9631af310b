#!/usr/bin/env bash
# The long form of the control-plane fault test: while 200 Workloads go through
# admission, eviction and completion under two kaccel replicas (leader and standby,
# never restarted; two leaders at once or a standby write fail the test), kill and
# restart kube-apiserver, etcd and the Kueue manager (e2e/cluster.sh restart),
# then check the ledger against Kueue's own history
# (ledger_crash::control_plane_restarts_lose_nothing, tests/e2e/ledger_crash.rs).
#
#   e2e/faults.sh [SPEC]     default SPEC kube-apiserver:10,etcd:3,kueue:5
#
# Runs on a fresh cluster of its own (default ports; take others down first) and
# prints the test's MEASURE lines: per component, serving again -> a probe Workload
# admitted through kaccel's credit check, p50 / max. The suite (e2e/test.sh) runs
# the fast form, kube-apiserver:2,etcd:1,kueue:1. Logs stay in
# ~/.cache/kaccel-e2e/faults-<time>/.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_FAULTS="${1:-kube-apiserver:10,etcd:3,kueue:5}"
export KACCEL_E2E_RUN="$CACHE/faults-$(date +%Y%m%d-%H%M%S)"

cargo test --features e2e --test e2e --no-run 2>&1 | tail -1 >&2
"$E2E_DIR/build.sh" >/dev/null
trap '"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true' EXIT
"$E2E_DIR/cluster.sh" up >"$KACCEL_E2E_RUN.up.log" 2>&1 || {
  tail -20 "$KACCEL_E2E_RUN.up.log" >&2
  exit 1
}
eval "$("$E2E_DIR/cluster.sh" env)"
echo "faults: $KACCEL_E2E_FAULTS (cluster in $KACCEL_E2E_RUN)"
cargo test --features e2e --test e2e -- --test-threads 1 --nocapture \
  ledger_crash::control_plane_restarts_lose_nothing 2>&1 | tee "$KACCEL_E2E_RUN/test.log" |
  grep -E '^(MEASURE|ledger_crash:|test |test result)'
grep -q '^test result: ok. 1 passed' "$KACCEL_E2E_RUN/test.log"
