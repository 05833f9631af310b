#!/usr/bin/env bash
# The main job on the embedded default: start the local control plane (etcd +
# kube-apiserver + Kueue, built from Go modules on first use), load the example
# fleet, apply the example AcceleratorClasses and CreditBudgets, let kaccel plan
# the Kueue objects and apply them, submit example Workloads to the team
# LocalQueues, and show what Kueue admitted on which flavor.
#
#   bash e2e/demo.sh          # leaves the cluster running; `e2e/cluster.sh down` stops it
#
# Until `kaccel run` (the controller) lands, kaccel's part is `kaccel plan`, whose
# output is applied with kubectl server-side apply under the field manager "kaccel".
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
cd "$REPO_DIR"
step() { printf '\n=== %s\n' "$*" >&2; }

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

step "kaccel plan (the Kueue objects kaccel writes), applied with server-side apply"
"$KACCEL" plan -f examples/classes.yaml examples/budgets.yaml --nodes examples/nodes.yaml -o summary
"$KACCEL" plan -f examples/classes.yaml examples/budgets.yaml --nodes examples/nodes.yaml -o yaml \
  | kubectl apply --server-side --field-manager=kaccel -f - >/dev/null
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

step "what Kueue admitted, on which flavor"
kubectl get workloads -A -o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,QUEUE:.spec.queueName,ADMITTED:.status.conditions[?(@.type=="Admitted")].status,CLUSTERQUEUE:.status.admission.clusterQueue,FLAVORS:.status.admission.podSetAssignments[*].flavors,WHY:.status.conditions[?(@.type=="QuotaReserved")].message'

cat >&2 <<MSG

The cluster keeps running. Try:
  eval "\$($E2E_DIR/cluster.sh env)"; kubectl get acceleratorclasses,creditbudgets
  $E2E_DIR/cluster.sh down
MSG
