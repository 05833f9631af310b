#!/usr/bin/env bash
# The main job on the embedded default: start the local control plane (etcd +
# kube-apiserver + Kueue, built from Go modules on first use), load the example
# fleet, apply the example AcceleratorClasses and CreditBudgets, run the kaccel
# controller against it (with the credit ledger on, in a SQLite file), submit
# example Workloads to the team LocalQueues, and show what Kueue admitted on which
# flavor and what the ledger charged.
#
#   bash e2e/demo.sh          # leaves the cluster and kaccel running
#   bash e2e/demo.sh stop     # stops kaccel and the cluster (logs kept)
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
cd "$REPO_DIR"
step() { printf '\n=== %s\n' "$*" >&2; }
RUN="${KACCEL_E2E_RUN:-${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}/run}"
KACCEL_HTTP="${KACCEL_DEMO_HTTP:-127.0.0.1:18080}"

stop_kaccel() {
  local pid
  pid="$(cat "$RUN/kaccel.pid" 2>/dev/null)" || return 0
  if [[ -n "$pid" && -d "/proc/$pid" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kaccel run'; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do [[ -d "/proc/$pid" ]] || break; sleep 0.1; done
  fi
  rm -f "$RUN/kaccel.pid"
}

if [[ "${1:-}" == "stop" ]]; then
  stop_kaccel
  exec "$E2E_DIR/cluster.sh" down
fi

step "building kaccel"
cargo build --quiet --bin kaccel
KACCEL="$CARGO_TARGET_DIR/debug/kaccel"

step "building the control plane (cached after the first run)"
"$E2E_DIR/build.sh" >/dev/null

step "starting the local control plane"
"$E2E_DIR/cluster.sh" up
eval "$("$E2E_DIR/cluster.sh" env)"

step "loading the example fleet (examples/nodes.yaml)"
"$E2E_DIR/nodes.sh" examples/nodes.yaml

step "team namespaces"
for ns in $(grep -hoE 'namespaces: \[[^]]*\]' examples/budgets.yaml | sed -E 's/.*\[(.*)\]/\1/' | tr -d ' ' | tr ',' ' '); do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done

step "kubectl apply -f examples/classes.yaml examples/budgets.yaml"
kubectl apply -f examples/classes.yaml -f examples/budgets.yaml

step "what kaccel will write (kaccel plan, offline)"
"$KACCEL" plan -f examples/classes.yaml examples/budgets.yaml --nodes examples/nodes.yaml -o summary

step "starting the controller: kaccel run (log: $RUN/kaccel.log, metrics: http://$KACCEL_HTTP/metrics)"
stop_kaccel
mkdir -p "$RUN"
# config/kaccel.yaml's defaults, with the credit ledger on (a SQLite file in the run
# folder): every ClusterQueue references kaccel's AdmissionCheck.
LEDGER="sqlite:$RUN/ledger.db"
cat >"$RUN/kaccel.yaml" <<CONFIG
ledger:
  enabled: true
  store: $LEDGER
  budgetIntervalSeconds: 5
CONFIG
# Under its own ServiceAccount with manifests/' RBAC (cluster.sh up minted the token).
KUBECONFIG="$KACCEL_E2E_CONTROLLER_KUBECONFIG" setsid nohup "$KACCEL" run --no-leader-election --http-address "$KACCEL_HTTP" \
  --config "$RUN/kaccel.yaml" >"$RUN/kaccel.log" 2>&1 </dev/null &
echo $! >"$RUN/kaccel.pid"
# Ready once its caches synced; then wait until every planned ClusterQueue is Active.
for _ in $(seq 1 100); do
  curl -fsS "http://$KACCEL_HTTP/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://$KACCEL_HTTP/readyz" >/dev/null || { tail -20 "$RUN/kaccel.log"; echo "kaccel did not become ready" >&2; exit 1; }
want=$("$KACCEL" plan -f examples/classes.yaml examples/budgets.yaml --nodes examples/nodes.yaml -o json | grep -c '"kind": "ClusterQueue"')
for _ in $(seq 1 100); do
  active=$(kubectl get clusterqueues -l app.kubernetes.io/managed-by=kaccel -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Active")].status}{"\n"}{end}' | grep -c True || true)
  ((active >= want)) && break
  sleep 0.2
done
kubectl get acceleratorclasses
kubectl get creditbudgets
kubectl get resourceflavors,cohorts,clusterqueues
kubectl get localqueues -A

step "submitting example Workloads (examples/workloads.yaml)"
kubectl apply -f examples/workloads.yaml >/dev/null
# Wait until Kueue has decided on every Workload (QuotaReserved present), bounded.
for _ in $(seq 1 60); do
  undecided=$(kubectl get workloads -A -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="QuotaReserved")].status}{"\n"}{end}' | awk 'NF<2' | wc -l)
  ((undecided == 0)) && break
  sleep 1
done

step "what Kueue admitted, on which flavor, and the credit check's answer"
kubectl get workloads -A -o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,QUEUE:.spec.queueName,ADMITTED:.status.conditions[?(@.type=="Admitted")].status,CLUSTERQUEUE:.status.admission.clusterQueue,FLAVORS:.status.admission.podSetAssignments[*].flavors,WHY:.status.conditions[?(@.type=="QuotaReserved")].message'
kubectl get workloads -A -o custom-columns='NAME:.metadata.name,CREDIT-CHECK:.status.admissionChecks[0].state,MESSAGE:.status.admissionChecks[0].message'

step "the credit ledger ($LEDGER)"
sleep 6 # one budget pass: status figures
kubectl get creditbudgets
"$KACCEL" ledger verify --store "$LEDGER" --cluster || true

cat >&2 <<MSG

The cluster and kaccel keep running. Try:
  eval "\$($E2E_DIR/cluster.sh env)"
  kubectl get acceleratorclasses,creditbudgets,clusterqueues
  kubectl edit acceleratorclass large-training      # watch kaccel re-plan ($RUN/kaccel.log)
  curl -s http://$KACCEL_HTTP/metrics | grep ^kaccel_
  $KACCEL ledger export --store $LEDGER --from 2026-01-01T00:00:00Z --to 2030-01-01T00:00:00Z --format focus
  bash $E2E_DIR/demo.sh stop
MSG
