#!/usr/bin/env bash
# The MultiKueue worker: a second local control plane (etcd, kube-apiserver,
# Kueue, ...) as e2e/cluster.sh starts it, in a run folder and on ports of its
# own, so it runs beside the manager cluster (tests/e2e/multikueue.rs).
#
#   e2e/worker.sh up|down|status|env|kill NAME|start NAME   (as e2e/cluster.sh)
#
# Environment:
#   KACCEL_E2E_WORKER_RUN  run folder (default: ${KACCEL_E2E_RUN}-worker when
#                          KACCEL_E2E_RUN is set, else ~/.cache/kaccel-e2e/worker-run)
#   KACCEL_E2E_WORKER_ETCD_CLIENT_PORT, ..._ETCD_PEER_PORT, ..._APISERVER_PORT,
#   ..._KUEUE_WEBHOOK_PORT, ..._KUEUE_METRICS_PORT, ..._KUEUE_HEALTH_PORT,
#   ..._SCHEDULER_PORT     ports (defaults in versions.env)
# `env` prints KACCEL_E2E_WORKER_KUBECONFIG (its admin kubeconfig) and
# KACCEL_E2E_WORKER_RUN, which the multikueue tests read.
set -euo pipefail
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
if [[ -n "${KACCEL_E2E_RUN:-}" ]]; then
  default_run="${KACCEL_E2E_RUN%/}-worker"
else
  default_run="$CACHE/worker-run"
fi
WORKER_RUN="${KACCEL_E2E_WORKER_RUN:-$default_run}"
if [[ "${1:-}" == env ]]; then
  echo "export KACCEL_E2E_WORKER_RUN='$WORKER_RUN'"
  echo "export KACCEL_E2E_WORKER_KUBECONFIG='$WORKER_RUN/kubeconfig'"
  exit 0
fi
export KACCEL_E2E_RUN="$WORKER_RUN"
export KACCEL_E2E_ETCD_CLIENT_PORT="${KACCEL_E2E_WORKER_ETCD_CLIENT_PORT:-$KACCEL_E2E_WORKER_ETCD_CLIENT_PORT_DEFAULT}"
export KACCEL_E2E_ETCD_PEER_PORT="${KACCEL_E2E_WORKER_ETCD_PEER_PORT:-$KACCEL_E2E_WORKER_ETCD_PEER_PORT_DEFAULT}"
export KACCEL_E2E_APISERVER_PORT="${KACCEL_E2E_WORKER_APISERVER_PORT:-$KACCEL_E2E_WORKER_APISERVER_PORT_DEFAULT}"
export KACCEL_E2E_KUEUE_WEBHOOK_PORT="${KACCEL_E2E_WORKER_KUEUE_WEBHOOK_PORT:-$KACCEL_E2E_WORKER_KUEUE_WEBHOOK_PORT_DEFAULT}"
export KACCEL_E2E_KUEUE_METRICS_PORT="${KACCEL_E2E_WORKER_KUEUE_METRICS_PORT:-$KACCEL_E2E_WORKER_KUEUE_METRICS_PORT_DEFAULT}"
export KACCEL_E2E_KUEUE_HEALTH_PORT="${KACCEL_E2E_WORKER_KUEUE_HEALTH_PORT:-$KACCEL_E2E_WORKER_KUEUE_HEALTH_PORT_DEFAULT}"
export KACCEL_E2E_SCHEDULER_PORT="${KACCEL_E2E_WORKER_SCHEDULER_PORT:-$KACCEL_E2E_WORKER_SCHEDULER_PORT_DEFAULT}"
exec "$E2E_DIR/cluster.sh" "$@"
