#!/usr/bin/env bash
# Health-loop reaction time (a measurement, not a test): 20 uncorrectable-ECC faults
# injected one at a time into fake dcgm-exporters on loopback, timed from the fault
# appearing at the source to the node cordoned AND the H100 quota reduced in Kueue,
# with a 1 s scrape interval. Prints p50 / p99.
#
#   bash e2e/bench-health.sh
#
# Uses a run folder and ports of its own and tears its cluster down at the end.
set -euo pipefail
E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export KACCEL_E2E_RUN="$CACHE/bench-health-run"
export KACCEL_E2E_ETCD_CLIENT_PORT=25791 KACCEL_E2E_ETCD_PEER_PORT=25792 \
  KACCEL_E2E_APISERVER_PORT=27543 KACCEL_E2E_KUEUE_WEBHOOK_PORT=30543 \
  KACCEL_E2E_KUEUE_METRICS_PORT=29544 KACCEL_E2E_KUEUE_HEALTH_PORT=29181
cd "$REPO_DIR"
"$E2E_DIR/build.sh" >/dev/null
"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
rm -rf "$KACCEL_E2E_RUN"
"$E2E_DIR/cluster.sh" up >/dev/null
trap '"$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true' EXIT
eval "$("$E2E_DIR/cluster.sh" env)"
cargo test --features e2e --test e2e reaction_time_over_20_faults -- --ignored --nocapture 2>&1 \
  | grep -E 'MEASURE|test result|panicked|timed out|Error:|error:'
