#!/usr/bin/env bash
# Controller figures on the local control plane (measurements, not tests).
#
#   bash e2e/bench-controller.sh [NODES]      # default 5000
#     - time for kaccel to sync its caches and write every planned object with N Nodes,
#     - its memory (VmRSS now, VmHWM peak) with N simulated Nodes in the API server,
#     - time from applying an AcceleratorClass to its ClusterQueue and LocalQueue
#       existing (median and max of 10), measured with `kubectl wait --for=create`.
#
#   bash e2e/bench-controller.sh scale [NODES] [WORKLOADS]   # defaults 5000, 20000
#     the fleet-scale case (tests/e2e/fleet_bench.rs): N synthetic Nodes of 6
#     vendors, WORKLOADS inactive Workloads (loaded first; Kueue works through them
#     before kaccel starts), 50 classes, 200 budgets, 500 fake dcgm-exporters on
#     loopback, kaccel in release with the SQLite ledger. Prints: start -> every
#     ClusterQueue written; settled memory; a quiet minute (writes, re-plans, polls
#     per exporter, missed polls); Node label changes and device health changes ->
#     the root Cohort's quota written (p50 / p99 / max), with kaccel's CPU, re-plans
#     and Node reads per change. KACCEL_BENCH_CLASSES, _BUDGETS, _EXPORTERS,
#     _CHANGES (each kind, default 50) and _QUIET_SECONDS change the sizes.
#
# Each uses a run folder and ports of its own, so a running demo or test cluster is
# not disturbed, and tears its cluster down at the end.
set -euo pipefail

if [[ "${1:-}" == scale ]]; then
  NODES="${2:-5000}"
  WORKLOADS="${3:-20000}"
  say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
  # shellcheck source=e2e/bench-lib.sh
  source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
  say "building kaccel and the measurement (release)"
  # One build: the test's kaccel binary (target/release/kaccel) is the one run.
  cargo test --release --features e2e --test e2e --no-run --quiet 2>/dev/null
  bench_cluster bench-fleet 35791 35792 35443 35543 35643 35081 35082
  say "loading $NODES synthetic Nodes"
  "$CARGO_TARGET_DIR/release/kaccel" generate-fleet --nodes "$NODES" --seed 42 >"$KACCEL_E2E_RUN/fleet.yaml"
  "$E2E_DIR/nodes.sh" "$KACCEL_E2E_RUN/fleet.yaml" 2>&1 | tail -1
  if ((WORKLOADS > 0)); then
    kubectl create namespace fleet-history >/dev/null
    create_inactive "$WORKLOADS" fleet-history history
    wait_for_kueue_quiet
  fi
  out="$KACCEL_E2E_RUN/bench-fleet.out"
  status=0
  cargo test --release --features e2e --test e2e controller_at_fleet_scale \
    -- --ignored --nocapture >"$out" 2>&1 || status=$?
  grep -E 'MEASURE|test result|panicked|Error:' "$out" | sed 's/^MEASURE /  /' || true
  echo "  Workloads in the cluster: $WORKLOADS (inactive, loaded before kaccel started)"
  [[ $status -eq 0 ]] || echo "  the measurement FAILED (exit $status); full output: $out"
  exit "$status"
fi

NODES="${1:-5000}"
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_RUN="$CACHE/bench-run"
export KACCEL_E2E_ETCD_CLIENT_PORT=24791 KACCEL_E2E_ETCD_PEER_PORT=24792 \
  KACCEL_E2E_APISERVER_PORT=27443 KACCEL_E2E_KUEUE_WEBHOOK_PORT=30443 \
  KACCEL_E2E_KUEUE_METRICS_PORT=29444 KACCEL_E2E_KUEUE_HEALTH_PORT=29081 KACCEL_E2E_SCHEDULER_PORT=29082
HTTP=127.0.0.1:18181
cd "$REPO_DIR"
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now_ms() { date +%s%3N; }

say "building kaccel (release)"
cargo build --release --quiet --bin kaccel
KACCEL="$CARGO_TARGET_DIR/release/kaccel"
"$E2E_DIR/build.sh" >/dev/null
"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
rm -rf "$KACCEL_E2E_RUN"
"$E2E_DIR/cluster.sh" up >/dev/null
eval "$("$E2E_DIR/cluster.sh" env)"
KPID=""
cleanup() {
  [[ -n "$KPID" ]] && kill "$KPID" 2>/dev/null || true
  "$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
}
trap cleanup EXIT

say "loading $NODES synthetic Nodes"
"$KACCEL" generate-fleet --nodes "$NODES" --seed 42 >"$KACCEL_E2E_RUN/fleet.yaml"
"$E2E_DIR/nodes.sh" "$KACCEL_E2E_RUN/fleet.yaml" 2>&1 | tail -1

for ns in vision-research vision-prod language research; do kubectl create namespace "$ns" >/dev/null; done
kubectl apply -f examples/classes.yaml -f examples/budgets.yaml >/dev/null
want=$("$KACCEL" plan -f examples/classes.yaml examples/budgets.yaml --nodes "$KACCEL_E2E_RUN/fleet.yaml" -o json | grep -c '"kind": "ClusterQueue"')

say "starting kaccel run"
t0=$(now_ms)
KUBECONFIG="$KACCEL_E2E_CONTROLLER_KUBECONFIG" "$KACCEL" run --no-leader-election --http-address "$HTTP" >"$KACCEL_E2E_RUN/kaccel.log" 2>&1 </dev/null &
KPID=$!
until curl -fsS "http://$HTTP/readyz" >/dev/null 2>&1; do sleep 0.05; done
t_ready=$(now_ms)
until (($(kubectl get clusterqueues -l app.kubernetes.io/managed-by=kaccel -o name | wc -l) >= want)); do sleep 0.1; done
t_written=$(now_ms)
say "caches synced in $((t_ready - t0)) ms; all $want ClusterQueues written $((t_written - t0)) ms after start"

sleep 5
rss=$(awk '/VmRSS/{print $2" "$3}' "/proc/$KPID/status")
hwm=$(awk '/VmHWM/{print $2" "$3}' "/proc/$KPID/status")
say "kaccel memory with $NODES Nodes: VmRSS $rss, peak VmHWM $hwm"

say "class applied -> ClusterQueue + LocalQueue exist (10 runs)"
times=()
for i in $(seq 1 10); do
  kubectl apply -f - >/dev/null <<EOF
apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata: {name: bench-$i}
spec:
  team: bench
  namespaces: [bench-$i]
  classes: [{name: bench-class-$i, guaranteedDevices: 1}]
  credits: {perPeriod: "10", period: {start: "2026-12-01T00:00:00Z", days: 30}}
EOF
  kubectl create namespace "bench-$i" >/dev/null
  sleep 1
  start=$(now_ms)
  sed -e "s/name: inference$/name: bench-class-$i/" examples/classes.yaml \
    | awk -v RS='---' -v ORS='---' "/name: bench-class-$i\n/" | kubectl apply -f - >/dev/null
  kubectl wait --for=create "clusterqueue/bench-$i-bench-class-$i" --timeout=60s >/dev/null
  kubectl wait --for=create -n "bench-$i" "localqueue/bench-class-$i" --timeout=60s >/dev/null
  times+=($(($(now_ms) - start)))
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
say "class -> queues, ms: $(echo $sorted | tr '\n' ' ')"
say "median $(echo "$sorted" | sed -n 5p) ms (of 10; includes kubectl's own start-up per call), max $(echo "$sorted" | tail -1) ms"
curl -fsS "http://$HTTP/metrics" | grep -E '^kaccel_(reconciles_total|reconcile_duration_seconds_(sum|count)|writes_total)' >&2
