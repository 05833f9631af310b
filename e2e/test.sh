#!/usr/bin/env bash
# Run every test: formatting, lints, unit/property/doc tests, then the
# end-to-end suite against a fresh local control plane (etcd + kube-apiserver
# + Kueue, built from Go modules by e2e/build.sh).
#
#   e2e/test.sh
#
# Environment:
#   CARGO_TARGET_DIR        default ~/.cache/kaccel-target (shared, warm builds)
#   KACCEL_E2E_KUBECONFIG   run the e2e suite against this cluster instead of
#                           starting one (it must have Kueue v0.16+ installed;
#                           the second pass on the oldest supported Kueue is skipped)
#   KACCEL_E2E_RUN          run folder (default: a fresh one per run under
#                           ~/.cache/kaccel-e2e/runs/); logs stay there
#   KACCEL_E2E_TEST_THREADS e2e test threads (default 1: tests share cluster-scoped Nodes)
# Fails (non-zero) on any error, including a harness that cannot be built.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
T0=$(date +%s)
step() { printf '\n=== [test %s +%4ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" >&2; }
cd "$REPO_DIR"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets --all-features -- -D warnings"
cargo clippy --all-targets --all-features -- -D warnings

step "cargo test (unit, property and doc tests)"
cargo test

step "PostgreSQL from Debian's packages (e2e/postgres.sh) for the ledger store suite"
KACCEL_TEST_POSTGRES_URL="$("$E2E_DIR/postgres.sh" start)"
export KACCEL_TEST_POSTGRES_URL
step "cargo test --features e2e --test ledger_postgres"
if ! cargo test --features e2e --test ledger_postgres; then
  "$E2E_DIR/postgres.sh" stop || true
  exit 1
fi
"$E2E_DIR/postgres.sh" stop

step "build the e2e test binary"
cargo test --features e2e --test e2e --no-run

if [[ -n "${KACCEL_E2E_KUBECONFIG:-}" ]]; then
  step "using the existing cluster KACCEL_E2E_KUBECONFIG=$KACCEL_E2E_KUBECONFIG (no local control plane)"
  export KUBECONFIG="$KACCEL_E2E_KUBECONFIG"
  step "kaccel's ServiceAccount and RBAC from manifests/, and its token (e2e/cluster.sh identity)"
  export KACCEL_E2E_RUN="${KACCEL_E2E_RUN:-$CACHE/external-$(date +%Y%m%d-%H%M%S)-$$}"
  "$E2E_DIR/cluster.sh" identity
  export KACCEL_E2E_CONTROLLER_KUBECONFIG="$KACCEL_E2E_RUN/kaccel.kubeconfig"
else
  step "build the control plane (cached after the first run)"
  "$E2E_DIR/build.sh" >/dev/null

  # Keep the logs of the last 10 runs.
  if [[ -d "$CACHE/runs" ]]; then
    find "$CACHE/runs" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' | sort -rn | tail -n +10 | cut -d' ' -f2- |
      while read -r d; do compgen -G "$d/*.pid" >/dev/null || rm -rf "$d"; done
  fi
  # A fresh cluster per run, in a run folder of its own.
  export KACCEL_E2E_RUN="${KACCEL_E2E_RUN:-$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$$}"
  # Ports are fixed: take down clusters left running by `cluster.sh up` or by
  # an interrupted earlier run.
  for d in "$CACHE/run" "$CACHE"/runs/*; do
    [[ -d "$d" && "$d" != "$KACCEL_E2E_RUN" ]] || continue
    if compgen -G "$d/*.pid" >/dev/null; then
      step "taking down the cluster left in $d"
      KACCEL_E2E_RUN="$d" "$E2E_DIR/cluster.sh" down
    fi
  done
  on_exit() {
    local rc=$?
    if ((rc != 0)); then
      for f in "$KACCEL_E2E_RUN"/{etcd,kube-apiserver,kueue}.log; do
        [[ -f "$f" ]] || continue
        printf '\n--- last 40 lines of %s\n' "$f" >&2
        tail -n 40 "$f" >&2
      done
    fi
    step "tearing down (logs kept in $KACCEL_E2E_RUN)"
    "$E2E_DIR/worker.sh" down || true
    "$E2E_DIR/cluster.sh" down || true
    exit $rc
  }
  trap on_exit EXIT
  step "start the local control plane in $KACCEL_E2E_RUN"
  "$E2E_DIR/cluster.sh" up
  eval "$("$E2E_DIR/cluster.sh" env)"
  # The MultiKueue worker (tests/e2e/multikueue.rs): a second control plane.
  eval "$("$E2E_DIR/worker.sh" env)"
  step "start the MultiKueue worker control plane in $KACCEL_E2E_WORKER_RUN"
  "$E2E_DIR/worker.sh" up
fi

step "cargo test --features e2e --test e2e"
cargo test --features e2e --test e2e -- --test-threads="${KACCEL_E2E_TEST_THREADS:-1}"

if [[ -z "${KACCEL_E2E_KUBECONFIG:-}" ]]; then
  # The suite above ran on the newest supported Kueue; the oldest gets the fast
  # form of the smoke and ledger flows, on a cluster of its own (same ports).
  # shellcheck source-path=SCRIPTDIR source=versions.env
  oldest="$(source "$E2E_DIR/versions.env" && echo "${KUEUE_SUPPORTED_VERSIONS##* }")"
  step "the smoke and ledger flows on Kueue $oldest (e2e/kueue-versions.sh --fast)"
  "$E2E_DIR/worker.sh" down
  "$E2E_DIR/cluster.sh" down
  "$E2E_DIR/kueue-versions.sh" --fast "$oldest"
fi

step "all tests passed in $(($(date +%s) - T0))s"
