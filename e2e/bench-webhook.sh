#!/usr/bin/env bash
# Latency the pod webhook adds to a pod's creation (a measurement, not a test):
# the same pod created N times asking for kaccel.io/accelerator (sent to kaccel,
# which reads the pod's Workload and rewrites the resource) and N times asking
# for nvidia.com/gpu (not sent: matchConditions), interleaved; create request ->
# response, in ms, with kaccel built in release (as deployed). Prints p50 / p99
# of each and the difference.
#
#   bash e2e/bench-webhook.sh [N]     # default 1000 pods each
#
# Uses a run folder and ports of its own and tears its cluster down at the end.
set -euo pipefail
N="${1:-1000}"
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_RUN="$CACHE/bench-webhook-run"
export KACCEL_E2E_ETCD_CLIENT_PORT=26891 KACCEL_E2E_ETCD_PEER_PORT=26892 \
  KACCEL_E2E_APISERVER_PORT=28643 KACCEL_E2E_KUEUE_WEBHOOK_PORT=31643 \
  KACCEL_E2E_KUEUE_METRICS_PORT=29744 KACCEL_E2E_KUEUE_HEALTH_PORT=29381
export KACCEL_BENCH_PODS="$N"
cd "$REPO_DIR"
"$E2E_DIR/build.sh" >/dev/null
"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
rm -rf "$KACCEL_E2E_RUN"
"$E2E_DIR/cluster.sh" up >/dev/null
trap '"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true' EXIT
eval "$("$E2E_DIR/cluster.sh" env)"
out="$KACCEL_E2E_RUN/bench-webhook.out"
status=0
cargo test --release --features e2e --test e2e webhook_latency_per_pod_creation \
  -- --ignored --nocapture >"$out" 2>&1 || status=$?
grep -E 'test result|panicked|timed out|Error:' "$out" || true
echo
echo "== summary (pod creation with vs without the pod webhook, $N pods each) =="
grep -E '^MEASURE' "$out" | sed 's/^MEASURE /  /' || true
[[ $status -eq 0 ]] || echo "  the measurement FAILED (exit $status); full output: $out"
exit "$status"
