#!/usr/bin/env bash
# kaccel's memory beside a busy cluster (a measurement, not a test). Runs the
# example classes and budgets with `kaccel run` and the credit ledger on, and
# prints VmRSS of kaccel and of the Kueue manager, with the kaccel / Kueue ratio.
#
#   bash e2e/bench-memory.sh [workloads] [N] [SETTLE]   # defaults 20000, 120
#       the example fleet, then N inactive Workloads (Kueue keeps finished and
#       deactivated ones until a retention policy removes them): RSS before, right
#       after they exist, after SETTLE seconds of nothing changing (flat?), and
#       SETTLE seconds after they are deleted (memory returned?); kaccel's CPU
#       per budget pass while nothing changes
#   bash e2e/bench-memory.sh soak [MINUTES] [RATE] [N]  # defaults 10, 10, 20000
#       N inactive Workloads, then RATE Workloads/s created, admitted through the
#       credit check, finished and deleted for MINUTES (tests/e2e/memory_churn.rs);
#       RSS every minute, end vs minute 2
#   bash e2e/bench-memory.sh nodes [M] [SETTLE]         # defaults 5000, 60
#       M synthetic Nodes (`kaccel generate-fleet`, each with 40 container images
#       in its status as a kubelet reports them), no Workloads
#
# KACCEL_BENCH_OPEN (default 100): Workloads admitted through the credit check
# and left running beside the others (capacity and a budget of their own), so
# the budget pass is measured with that many open reservations.
# KACCEL_BENCH_PERF=FILE records a CPU profile of kaccel (perf) over the quiet
# window in which the budget pass is timed.
# KACCEL_BENCH_PROFILE (default release) and KACCEL_BENCH_FEATURES (e.g.
# mimalloc: the allocator comparison) choose the build. Uses a run folder and
# ports of its own, so a running demo or test cluster is not disturbed; tears its
# cluster down at the end.
set -euo pipefail

MODE=workloads
if [[ "${1:-}" =~ ^(workloads|soak|nodes)$ ]]; then MODE="$1"; shift; fi
PROFILE="${KACCEL_BENCH_PROFILE:-release}"
FEATURES="${KACCEL_BENCH_FEATURES:-}"
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_RUN="$CACHE/bench-memory-run"
export KACCEL_E2E_ETCD_CLIENT_PORT=33791 KACCEL_E2E_ETCD_PEER_PORT=33792 \
  KACCEL_E2E_APISERVER_PORT=33443 KACCEL_E2E_KUEUE_WEBHOOK_PORT=33543 \
  KACCEL_E2E_KUEUE_METRICS_PORT=33643 KACCEL_E2E_KUEUE_HEALTH_PORT=33081 KACCEL_E2E_SCHEDULER_PORT=33082
HTTP=127.0.0.1:18191
NS=vision-research
cd "$REPO_DIR"
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# shellcheck source=e2e/bench-lib.sh
source "$E2E_DIR/bench-lib.sh" # create_inactive, wait_for_kueue_quiet

say "building kaccel (profile $PROFILE${FEATURES:+, features $FEATURES})"
cargo build --profile "$PROFILE" --quiet --bin kaccel ${FEATURES:+--features "$FEATURES"}
if [[ "$PROFILE" == dev ]]; then KACCEL="$CARGO_TARGET_DIR/debug/kaccel"; else KACCEL="$CARGO_TARGET_DIR/$PROFILE/kaccel"; fi
# A copy, so a build for another comparison cannot replace the running binary.
cp "$KACCEL" "$CACHE/kaccel-bench-memory"
KACCEL="$CACHE/kaccel-bench-memory"
if [[ "$MODE" == soak ]]; then
  say "building the churn driver"
  cargo test --features e2e --test e2e --no-run --quiet 2>/dev/null
fi
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

if [[ "$MODE" == nodes ]]; then
  M="${1:-5000}"
  SETTLE="${2:-60}"
  say "generating $M Nodes"
  "$KACCEL" generate-fleet --nodes "$M" | python3 -c '
import sys, yaml
# A kubelet reports up to 50 images (--node-status-max-images); 40 here.
images = [{"names": [f"registry.example.com/team/app-{i}@sha256:{i:064x}", f"registry.example.com/team/app-{i}:v{i}"],
           "sizeBytes": 100000000 + i} for i in range(40)]
for node in yaml.safe_load_all(sys.stdin):
    if node:
        node.setdefault("status", {})["images"] = images
        print("---"); print(yaml.safe_dump(node))
' >"$KACCEL_E2E_RUN/fleet.yaml"
  "$E2E_DIR/nodes.sh" "$KACCEL_E2E_RUN/fleet.yaml" >/dev/null 2>&1
else
  "$E2E_DIR/nodes.sh" examples/nodes.yaml >/dev/null 2>&1
fi
for ns in vision-research vision-prod language research; do kubectl create namespace "$ns" >/dev/null; done
kubectl apply -f examples/classes.yaml -f examples/budgets.yaml >/dev/null
OPEN="${KACCEL_BENCH_OPEN:-100}"
if [[ "$MODE" != nodes ]] && ((OPEN > 0)); then
  # Capacity and a budget of their own for OPEN long-running Workloads, so the
  # budget pass is measured with that many open reservations (the example
  # fleet's large-training capacity is granted to the example teams).
  python3 - "$OPEN" >"$KACCEL_E2E_RUN/open-capacity.yaml" <<'PY'
import copy, sys, yaml
open_n = int(sys.argv[1])
h100 = next(d for d in yaml.safe_load_all(open("examples/nodes.yaml"))
            if d and d["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-H100-80GB-HBM3")
for i in range((open_n + 7) // 8):
    node = copy.deepcopy(h100)
    name = f"bench-h100-{i:03d}"
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    print("---"); print(yaml.safe_dump(node))
PY
  "$E2E_DIR/nodes.sh" "$KACCEL_E2E_RUN/open-capacity.yaml" >/dev/null 2>&1
  kubectl create namespace bench-open >/dev/null
  kubectl apply -f - >/dev/null <<BUDGET
apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata:
  name: bench-open
spec:
  team: bench-open
  namespaces: [bench-open]
  classes:
    - name: large-training
      guaranteedDevices: $OPEN
  credits:
    perPeriod: "1000000"
    period: {start: "2026-12-01T00:00:00Z", days: 30}
  onExhaustion: Hold
BUDGET
fi
cat >"$KACCEL_E2E_RUN/kaccel.yaml" <<CONFIG
ledger:
  enabled: true
  store: sqlite:$KACCEL_E2E_RUN/ledger.db
  budgetIntervalSeconds: 5
CONFIG
KUBECONFIG="$KACCEL_E2E_CONTROLLER_KUBECONFIG" "$KACCEL" run --no-leader-election --http-address "$HTTP" --config "$KACCEL_E2E_RUN/kaccel.yaml" \
  >"$KACCEL_E2E_RUN/kaccel.log" 2>&1 </dev/null &
KPID=$!
until curl -fsS "http://$HTTP/readyz" >/dev/null 2>&1; do sleep 0.2; done
QPID=$(cat "$KACCEL_E2E_RUN/kueue.pid")
sleep 10

rss() { awk '/VmRSS/{print int($2/1024)}' "/proc/$1/status"; }
# utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
metric() { curl -fsS "http://$HTTP/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# A metric summed over its label sets.
metric_sum() { curl -fsS "http://$HTTP/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'; }
report() {
  local k q
  k=$(rss "$KPID") q=$(rss "$QPID")
  printf '| %s | %s MiB | %s MiB | %s |\n' "$1" "$k" "$q" "$(awk -v k="$k" -v q="$q" 'BEGIN{printf "%.2f", k/q}')"
}
# Budget passes over a quiet window: their count, mean wall time and mean
# process CPU time while each ran (an upper bound on a pass's own), and all of
# kaccel's CPU in the window.
pass_cpu() {
  local window="$1" t0 t1 a b
  a=$(curl -fsS "http://$HTTP/metrics") t0=$(cpu_ticks "$KPID")
  if [[ -n "${KACCEL_BENCH_PERF:-}" ]]; then
    perf record --call-graph dwarf,16384 -F 199 -p "$KPID" -o "$KACCEL_BENCH_PERF" -- sleep "$window" >/dev/null 2>&1
  else
    sleep "$window"
  fi
  b=$(curl -fsS "http://$HTTP/metrics") t1=$(cpu_ticks "$KPID")
  { echo "$a" | sed 's/^/A /'; echo "$b" | sed 's/^/B /'; } | awk -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v w="$window" '
    { v[$1 " " $2] = $3 }
    END {
      n = v["B kaccel_ledger_budget_pass_seconds_count"] - v["A kaccel_ledger_budget_pass_seconds_count"]
      wall = v["B kaccel_ledger_budget_pass_seconds_sum"] - v["A kaccel_ledger_budget_pass_seconds_sum"]
      cpu = v["B kaccel_ledger_budget_pass_cpu_seconds_sum"] - v["A kaccel_ledger_budget_pass_cpu_seconds_sum"]
      printf "budget passes in %ss of nothing changing: %d, wall %.2f ms and CPU %.2f ms per pass (mean); kaccel CPU in the window: %.0f ms\n",
        w, n, (n > 0 ? 1000 * wall / n : 0), (n > 0 ? 1000 * cpu / n : 0), 1000 * t / hz }'
}
delete_inactive() {
  say "deleting the Workloads"
  # One deletecollection request per creation chunk of 500 (one for all of them
  # outlives the API server's request timeout at 100,000), not one DELETE each.
  kubectl get workloads.kueue.x-k8s.io -n "$NS" -l bench.kaccel.io/memory=yes \
    -o jsonpath='{range .items[*]}{.metadata.labels.bench\.kaccel\.io/chunk}{"\n"}{end}' | sort -u |
    xargs -P 3 -I{} kubectl delete --raw "/apis/kueue.x-k8s.io/v1beta2/namespaces/$NS/workloads?labelSelector=bench.kaccel.io%2Fchunk%3D{}" >/dev/null || true
  until (($(kubectl get workloads.kueue.x-k8s.io -n "$NS" -l bench.kaccel.io/memory=yes -o name | wc -l) == 0)); do sleep 5; done
}
build_label="$PROFILE build${FEATURES:+, $FEATURES}"
# OPEN Workloads of one GPU each admitted through the credit check and left
# running (maximumExecutionTimeSeconds 7200): that many open reservations.
open_reservations() {
  ((OPEN > 0)) || return 0
  say "admitting $OPEN long-running Workloads through the credit check (bench-open)"
  {
    echo '{"apiVersion": "v1", "kind": "List", "items": ['
    for ((i = 0; i < OPEN; i++)); do
      ((i > 0)) && echo ","
      printf '{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "open-%04d", "namespace": "bench-open", "labels": {"bench.kaccel.io/open": "yes"}}, "spec": {"queueName": "large-training", "maximumExecutionTimeSeconds": 7200, "podSets": [{"name": "main", "count": 1, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}}}]}}' "$i"
    done
    echo "]}"
  } | kubectl create -f - >/dev/null
  kubectl wait --for=condition=Admitted workloads.kueue.x-k8s.io -n bench-open -l bench.kaccel.io/open=yes --timeout=300s >/dev/null
  say "open reservations in the ledger: $(metric_sum kaccel_ledger_open_reservations)"
}
case "$MODE" in
workloads)
  N="${1:-20000}"
  SETTLE="${2:-120}"
  echo "| $N inactive Workloads ($build_label) | kaccel RSS | Kueue RSS | kaccel/Kueue |"
  echo "|---|---|---|---|"
  open_reservations
  report "before ($OPEN open reservations)"
  create_inactive "$N" "$NS" large-training
  sleep 5
  report "+0 s (all created)"
  wait_for_kueue_quiet
  sleep "$SETTLE"
  report "+$SETTLE s (nothing changed)"
  pass_cpu 30
  hwm=$(awk '/VmHWM/{print int($2/1024)}' "/proc/$KPID/status")
  delete_inactive
  sleep "$SETTLE"
  report "+$SETTLE s after deleting them"
  echo
  echo "kaccel peak (VmHWM) while they existed: $hwm MiB"
  ;;
soak)
  MINUTES="${1:-10}"
  RATE="${2:-10}"
  N="${3:-20000}"
  open_reservations
  create_inactive "$N" "$NS" large-training
  wait_for_kueue_quiet
  echo "| soak: $N inactive Workloads + $RATE Workloads/s churn ($build_label) | kaccel RSS | Kueue RSS | kaccel/Kueue |"
  echo "|---|---|---|---|"
  report "before the churn"
  pass_cpu 30
  # The churn runs in another team's queue than the history's.
  KACCEL_CHURN_NAMESPACE="${KACCEL_BENCH_CHURN_NAMESPACE:-language}" KACCEL_CHURN_QUEUE=large-training KACCEL_CHURN_RATE="$RATE" \
    KACCEL_CHURN_SECONDS="$((MINUTES * 60))" \
    cargo test --features e2e --test e2e workload_churn -- --ignored --nocapture \
    >"$KACCEL_E2E_RUN/churn.out" 2>&1 &
  CHURN=$!
  t0=$(cpu_ticks "$KPID") p0=$(metric kaccel_ledger_budget_pass_seconds_count)
  # Where the machine's CPU goes during the churn: the control plane's share too.
  APID=$(cat "$KACCEL_E2E_RUN/kube-apiserver.pid") EPID=$(cat "$KACCEL_E2E_RUN/etcd.pid")
  q0=$(cpu_ticks "$QPID") a0=$(cpu_ticks "$APID") e0=$(cpu_ticks "$EPID")
  for ((m = 1; m <= MINUTES; m++)); do
    sleep 60
    report "minute $m"
    [[ $m -eq 2 ]] && rss2=$(rss "$KPID")
  done
  rss_end=$(rss "$KPID")
  t1=$(cpu_ticks "$KPID") p1=$(metric kaccel_ledger_budget_pass_seconds_count)
  q1=$(cpu_ticks "$QPID") a1=$(cpu_ticks "$APID") e1=$(cpu_ticks "$EPID")
  churn_status=0
  wait "$CHURN" || churn_status=$?
  echo
  grep -E '^MEASURE churn' "$KACCEL_E2E_RUN/churn.out" | tail -1 | sed 's/^MEASURE /  /'
  [[ $churn_status -eq 0 ]] || echo "  the churn driver FAILED (exit $churn_status): $KACCEL_E2E_RUN/churn.out"
  awk -v a="${rss2:-0}" -v b="$rss_end" 'BEGIN{printf "RSS at the end vs minute 2: %d vs %d MiB (%+.1f %%)\n", b, a, (a>0 ? 100*(b-a)/a : 0)}'
  awk -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v p="$(awk -v a="$p1" -v b="$p0" 'BEGIN{print a-b}')" -v s="$((MINUTES * 60))" \
    'BEGIN{printf "kaccel CPU during the churn: %.1f s over %d s (%.1f %% of one core); %d budget passes\n", t/hz, s, 100*t/hz/s, p}'
  awk -v q="$((q1 - q0))" -v a="$((a1 - a0))" -v e="$((e1 - e0))" -v hz="$(getconf CLK_TCK)" -v s="$((MINUTES * 60))" \
    'BEGIN{printf "control plane CPU during the churn: Kueue %.1f s, kube-apiserver %.1f s, etcd %.1f s over %d s\n", q/hz, a/hz, e/hz, s}'
  echo "credit check reconciles failed and retried: $(grep -c 'credit check reconcile failed' "$KACCEL_E2E_RUN/kaccel.log" || true)"
  echo "budget passes during the churn: $(curl -fsS "http://$HTTP/metrics" | awk '$1=="kaccel_ledger_budget_pass_seconds_sum"{s=$2} $1=="kaccel_ledger_budget_pass_cpu_seconds_sum"{u=$2} $1=="kaccel_ledger_budget_pass_seconds_count"{c=$2} END{printf "%d, wall %.2f ms and CPU %.2f ms per pass (mean)", c, 1000*s/c, 1000*u/c}')"
  exit "$churn_status"
  ;;
nodes)
  echo "| $M Nodes ($build_label) | kaccel RSS | Kueue RSS | kaccel/Kueue |"
  echo "|---|---|---|---|"
  sleep "$SETTLE"
  report "+$SETTLE s"
  echo
  echo "kaccel peak (VmHWM): $(awk '/VmHWM/{print int($2/1024)}' "/proc/$KPID/status") MiB"
  ;;
esac
