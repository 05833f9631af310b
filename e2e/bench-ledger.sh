#!/usr/bin/env bash
# Admission latency the credit AdmissionCheck adds (a measurement, not a test).
# One kaccel-managed ClusterQueue (with the kaccel-credits check, SQLite ledger)
# and one plain ClusterQueue the measurement creates itself (own ResourceFlavor,
# no admission checks, not labelled managed-by=kaccel); the same N Workloads go into
# each, interleaved, a few in flight per queue (well inside quota). Latency per
# Workload = create request sent -> Admitted=True first seen on a watch, in ms.
# Prints p50 / p90 / p99 / mean per queue, the difference, and ledger figures.
#
#   bash e2e/bench-ledger.sh [N]          # default 200 per queue, 4 in flight
#   KACCEL_BENCH_BURST=1 bash e2e/bench-ledger.sh 2000
#                                         # all 2N created at once (adds a fake
#                                         # H100 node with N devices for room)
#   KACCEL_BENCH_WORKLOAD_WEBHOOK=0 ...   # without kaccel's Workload webhook
#                                         # (registered by default: the finalizer
#                                         # on at creation)
#
# kaccel runs as built in release (as deployed).
# Uses a run folder and ports of its own and tears its cluster down at the end.
set -euo pipefail
N="${1:-200}"
# shellcheck source=e2e/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
export KACCEL_BENCH_WORKLOADS="$N"
bench_cluster bench-ledger 26791 26792 28543 31543 29644 29281 29282
out="$KACCEL_E2E_RUN/bench-ledger.out"
status=0
cargo test --release --features e2e --test e2e admission_latency_with_and_without_the_credit_check \
  -- --ignored --nocapture >"$out" 2>&1 || status=$?
grep -E 'MEASURE|test result|panicked|timed out|Error:|error' "$out" || true
echo
echo "== summary (kaccel credit check vs plain ClusterQueue, $N Workloads each) =="
grep -E 'MEASURE (with|without|added|phase|admissions|burst|ledger|SQLite)' "$out" | sed 's/^MEASURE /  /' || true
[[ $status -eq 0 ]] || echo "  the measurement FAILED (exit $status); full output: $out"
exit "$status"
