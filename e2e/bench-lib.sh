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
