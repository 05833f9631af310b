#!/usr/bin/env bash
# kaccel's memory beside a cluster's Workload history (a measurement, not a test):
# the example fleet, classes and budgets, `kaccel run` with the credit ledger on,
# then N inactive Workloads (Kueue keeps finished and deactivated Workloads until a
# retention policy removes them). Prints VmRSS of kaccel and of the Kueue manager
# before, right after the Workloads exist, after SETTLE seconds (constant objects:
# memory must stay flat), and SETTLE seconds after they are deleted, with the
# kaccel / Kueue ratio.
#
#   bash e2e/bench-memory.sh [N] [SETTLE]     # defaults 20000 and 120
#   KACCEL_BENCH_PROFILE=release bash e2e/bench-memory.sh 100000
#
# Uses a run folder and ports of its own, so a running demo or test cluster is not
# disturbed; tears its cluster down at the end.
set -euo pipefail

N="${1:-20000}"
SETTLE="${2:-120}"
PROFILE="${KACCEL_BENCH_PROFILE:-dev}"
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_RUN="$CACHE/bench-memory-run"
export KACCEL_E2E_ETCD_CLIENT_PORT=33791 KACCEL_E2E_ETCD_PEER_PORT=33792 \
  KACCEL_E2E_APISERVER_PORT=33443 KACCEL_E2E_KUEUE_WEBHOOK_PORT=33543 \
  KACCEL_E2E_KUEUE_METRICS_PORT=33643 KACCEL_E2E_KUEUE_HEALTH_PORT=33081
HTTP=127.0.0.1:18191
NS=vision-research
cd "$REPO_DIR"
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

say "building kaccel (profile $PROFILE)"
cargo build --profile "$PROFILE" --quiet --bin kaccel
if [[ "$PROFILE" == dev ]]; then KACCEL="$CARGO_TARGET_DIR/debug/kaccel"; else KACCEL="$CARGO_TARGET_DIR/$PROFILE/kaccel"; fi
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

"$E2E_DIR/nodes.sh" examples/nodes.yaml >/dev/null 2>&1
for ns in vision-research vision-prod language research; do kubectl create namespace "$ns" >/dev/null; done
kubectl apply -f examples/classes.yaml -f examples/budgets.yaml >/dev/null
cat >"$KACCEL_E2E_RUN/kaccel.yaml" <<CONFIG
ledger:
  enabled: true
  store: sqlite:$KACCEL_E2E_RUN/ledger.db
  budgetIntervalSeconds: 5
CONFIG
"$KACCEL" run --no-leader-election --http-address "$HTTP" --config "$KACCEL_E2E_RUN/kaccel.yaml" \
  >"$KACCEL_E2E_RUN/kaccel.log" 2>&1 </dev/null &
KPID=$!
until curl -fsS "http://$HTTP/readyz" >/dev/null 2>&1; do sleep 0.2; done
QPID=$(cat "$KACCEL_E2E_RUN/kueue.pid")
sleep 10

rss() { awk '/VmRSS/{print int($2/1024)}' "/proc/$1/status"; }
report() {
  local k q
  k=$(rss "$KPID") q=$(rss "$QPID")
  printf '| %s | %s MiB | %s MiB | %s |\n' "$1" "$k" "$q" "$(awk -v k="$k" -v q="$q" 'BEGIN{printf "%.2f", k/q}')"
}
echo "| $N inactive Workloads ($PROFILE build) | kaccel RSS | Kueue RSS | kaccel/Kueue |"
echo "|---|---|---|---|"
report "before"

say "creating $N inactive Workloads in $NS"
chunk=500
for ((start = 0; start < N; start += chunk)); do
  end=$((start + chunk < N ? start + chunk : N))
  {
    echo '{"apiVersion": "v1", "kind": "List", "items": ['
    for ((i = start; i < end; i++)); do
      ((i > start)) && echo ','
      printf '{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "hist-%06d", "namespace": "%s", "labels": {"bench.kaccel.io/memory": "yes"}}, "spec": {"active": false, "queueName": "large-training", "podSets": [{"name": "main", "count": 8, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}}}]}}' "$i" "$NS"
    done
    echo ']}'
  } | kubectl create -f - >/dev/null
done
sleep 5
report "+0 s (all created)"
sleep "$SETTLE"
report "+$SETTLE s (nothing changed)"
hwm=$(awk '/VmHWM/{print int($2/1024)}' "/proc/$KPID/status")

say "deleting the Workloads"
kubectl delete workloads.kueue.x-k8s.io -n "$NS" -l bench.kaccel.io/memory=yes --wait=false >/dev/null
until (($(kubectl get workloads.kueue.x-k8s.io -n "$NS" -l bench.kaccel.io/memory=yes -o name | wc -l) == 0)); do sleep 2; done
sleep "$SETTLE"
report "+$SETTLE s after deleting them"
echo
echo "kaccel peak (VmHWM) while they existed: $hwm MiB"
