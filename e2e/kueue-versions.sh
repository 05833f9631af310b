#!/usr/bin/env bash
# The smoke and ledger flows on each supported Kueue release, each on a fresh
# local control plane of its own (Kueue built from Go modules by e2e/build.sh).
#
#   e2e/kueue-versions.sh [--fast] [VERSION...]
#
# VERSION...  Kueue releases (default: KUEUE_SUPPORTED_VERSIONS in versions.env)
# --fast      only the smoke test, the SQLite ledger flow and the start-up check
#             of Kueue's schema (what e2e/test.sh runs on the oldest supported
#             release); without it, every test of the smoke, ledger and
#             kueue_compat modules (PostgreSQL ones included: e2e/postgres.sh)
#
# Prints one line per release (passed / FAILED, tests run, seconds) and exits
# non-zero if any failed. Logs: $KACCEL_E2E_CACHE/kueue-versions/<release>-<time>/.
# Uses the default ports (versions.env): take down other clusters on them first.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
T0=$(date +%s)
log() { printf '[kueue-versions %s +%4ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" >&2; }

fast=0
if [[ "${1:-}" == "--fast" ]]; then
  fast=1
  shift
fi
read -r -a versions <<<"${*:-$KUEUE_SUPPORTED_VERSIONS}"
if ((fast)); then
  filters=(smoke:: ledger::small_budget_flow_sqlite kueue_compat::)
else
  filters=(smoke:: ledger:: kueue_compat::)
fi

cd "$REPO_DIR"
log "building the e2e test binary"
cargo test --features e2e --test e2e --no-run 2>&1 | tail -1 >&2

pg_started=0
if ((!fast)) && [[ -z "${KACCEL_TEST_POSTGRES_URL:-}" ]]; then
  log "PostgreSQL for the ledger flows (e2e/postgres.sh)"
  KACCEL_TEST_POSTGRES_URL="$("$E2E_DIR/postgres.sh" start)"
  export KACCEL_TEST_POSTGRES_URL
  pg_started=1
fi

results=()
failed=0
run_dir=""
cleanup() {
  [[ -n "$run_dir" ]] && KACCEL_E2E_RUN="$run_dir" "$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
  ((pg_started)) && "$E2E_DIR/postgres.sh" stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

for version in "${versions[@]}"; do
  t=$(date +%s)
  export KACCEL_E2E_KUEUE_VERSION="$version"
  run_dir="$CACHE/kueue-versions/$version-$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$run_dir"
  log "Kueue $version: build (cached after the first time), cluster in $run_dir"
  if ! "$E2E_DIR/build.sh" >"$run_dir/build.log" 2>&1; then
    results+=("$version FAILED (build: $run_dir/build.log)")
    failed=1
    continue
  fi
  status="passed"
  if ! KACCEL_E2E_RUN="$run_dir" "$E2E_DIR/cluster.sh" up >"$run_dir/cluster-up.log" 2>&1; then
    status="FAILED (cluster up: $run_dir/cluster-up.log)"
  else
    # The env lines export KUBECONFIG and the ports of this cluster.
    eval "$(KACCEL_E2E_RUN="$run_dir" "$E2E_DIR/cluster.sh" env)"
    if ! cargo test --features e2e --test e2e -- --test-threads 1 "${filters[@]}" >"$run_dir/tests.log" 2>&1; then
      status="FAILED (tests: $run_dir/tests.log)"
    fi
  fi
  summary="$(grep -E '^test result:' "$run_dir/tests.log" 2>/dev/null | tail -1 | sed 's/; finished in.*//')"
  KACCEL_E2E_RUN="$run_dir" "$E2E_DIR/cluster.sh" down >/dev/null 2>&1 || true
  run_dir=""
  [[ "$status" == passed ]] || failed=1
  results+=("Kueue $version: $status, ${summary:-no tests ran}, $(($(date +%s) - t)) s")
  log "${results[-1]}"
done

printf '\n%s\n' "Smoke and ledger flows per Kueue release (filters: ${filters[*]}):"
printf '  %s\n' "${results[@]}"
exit "$failed"
