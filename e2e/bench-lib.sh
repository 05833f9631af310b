# Sourced by the e2e/bench-*.sh measurements: the paths they share, and a local
# control plane of the bench's own (its own run folder and ports, so it can run
# beside the test suite's), started fresh and torn down when the script exits.
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"

#   bench_cluster <name> <etcd-client> <etcd-peer> <apiserver> <kueue-webhook> \
#                 <kueue-metrics> <kueue-health> <scheduler>
# Builds the binaries, starts the cluster in $CACHE/<name>-run on those ports,
# exports its environment (KUBECONFIG, ...) and leaves the shell in the repository.
bench_cluster() {
  export KACCEL_E2E_RUN="$CACHE/$1-run"
  export KACCEL_E2E_ETCD_CLIENT_PORT="$2" KACCEL_E2E_ETCD_PEER_PORT="$3" \
    KACCEL_E2E_APISERVER_PORT="$4" KACCEL_E2E_KUEUE_WEBHOOK_PORT="$5" \
    KACCEL_E2E_KUEUE_METRICS_PORT="$6" KACCEL_E2E_KUEUE_HEALTH_PORT="$7" KACCEL_E2E_SCHEDULER_PORT="$8"
  cd "$REPO_DIR"
  "$E2E_DIR/build.sh" >/dev/null
  "$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$KACCEL_E2E_RUN"
  "$E2E_DIR/cluster.sh" up >/dev/null
  trap '"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true' EXIT
  eval "$("$E2E_DIR/cluster.sh" env)"
}

#   create_inactive <n> <namespace> <queue-name>
# n inactive Workloads (8 GPUs each, as a job history holds them) named hist-NNNNNN,
# labelled bench.kaccel.io/memory=yes and by creation chunk of 500.
create_inactive() {
  local n="$1" ns="$2" queue="$3" chunk=500 start
  say "creating $n inactive Workloads in $ns"
  for ((start = 0; start < n; start += chunk)); do
    echo "$start $((start + chunk < n ? start + chunk : n))"
  done | xargs -r -P 3 -L 1 bash -c '
    { echo "{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": ["
      for ((i = $0; i < $1; i++)); do
        ((i > $0)) && echo ","
        printf "{\"apiVersion\": \"kueue.x-k8s.io/v1beta2\", \"kind\": \"Workload\", \"metadata\": {\"name\": \"hist-%06d\", \"namespace\": \"%s\", \"labels\": {\"bench.kaccel.io/memory\": \"yes\", \"bench.kaccel.io/chunk\": \"c%s\"}}, \"spec\": {\"active\": false, \"queueName\": \"%s\", \"podSets\": [{\"name\": \"main\", \"count\": 8, \"template\": {\"spec\": {\"restartPolicy\": \"Never\", \"containers\": [{\"name\": \"main\", \"image\": \"registry.k8s.io/pause:3.10\", \"resources\": {\"requests\": {\"cpu\": \"8\", \"memory\": \"64Gi\", \"nvidia.com/gpu\": \"8\"}, \"limits\": {\"nvidia.com/gpu\": \"8\"}}}]}}}]}}" "$i" "'"$ns"'" "$0" "'"$queue"'"
      done
      echo "]}"; } | kubectl create -f - >/dev/null'
}
# Waits (at most KACCEL_BENCH_KUEUE_WAIT seconds, default 1800) until Kueue has
# worked through what was just created: fewer than 10 Workload status writes in
# 10 s, read from the API server's request counter. (On 2 cores Kueue takes about
# 15 minutes to write the status of 20,000 new inactive Workloads, about 45
# writes/s with the API server saturated, and until then adds kaccel's check to a
# new Workload's status only minutes late: a churn started earlier measures that.)
status_writes() {
  kubectl get --raw /metrics | awk '/^apiserver_request_total\{/ && /resource="workloads"/ && /subresource="status"/ && /verb="(PUT|PATCH|APPLY)"/ {s += $NF} END {print s + 0}'
}
wait_for_kueue_quiet() {
  local a b waited=0 limit="${KACCEL_BENCH_KUEUE_WAIT:-1800}"
  while ((waited < limit)); do
    a=$(status_writes); sleep 10; b=$(status_writes); waited=$((waited + 10))
    if ((b - a < 10)); then say "Kueue done with the Workloads after ${waited}s"; return 0; fi
  done
  say "Kueue still writing Workload status after ${waited}s"
}

