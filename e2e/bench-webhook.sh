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
# shellcheck source=e2e/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
export KACCEL_BENCH_PODS="$N"
bench_cluster bench-webhook 26891 26892 28643 31643 29744 29381 29382
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
