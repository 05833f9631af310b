#!/usr/bin/env bash
# The whole benchmark set, one after the other on this machine, and one table of
# the figures the fleet-scale issue names: figure, target, same-run baseline (where
# one exists), the figure now, and the ratio (now / baseline, else now / target).
#
#   bash e2e/bench-all.sh           # full sizes: about 60 minutes on 2 cores
#   bash e2e/bench-all.sh quick     # small sizes (same steps): about 20 minutes
#   bash e2e/bench-all.sh table DIR # the table again from a run's output folder
#
# Steps (each one's whole output is kept in the output folder):
#   plan       cargo bench --bench plan (criterion): 5,000 device-plugin Nodes,
#              the DRA fleet of 5,000 Nodes; each also re-planned after one Node
#              change (the last LocalQueues kept, as the controller re-plans)
#   ledger     kaccel ledger bench on SQLite and on PostgreSQL (e2e/postgres.sh):
#              batched append rate over the last tenth, single-entry append p99,
#              CSV and FOCUS export rows/s and peak RSS, verify time
#   admission  e2e/bench-ledger.sh: the credit check against a plain ClusterQueue
#              in the same run, 4 in flight, and a burst created at once
#   fleet      e2e/bench-controller.sh scale: 5,000 Nodes, 20,000 Workloads, 500
#              exporters: change -> quota, quiet minute, polls, RSS
#
# KACCEL_BENCH_ALL_STEPS="plan ledger admission fleet" picks steps (a table row
# whose step did not run, or whose line was not found, shows "-").
# KACCEL_BENCH_ALL_OUT names the output folder (default
# ~/.cache/kaccel-e2e/bench-all-<date>); the table is also written to table.md
# there. Each step uses a control plane / database of its own and tears it down.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
MODE="${1:-full}"
case "$MODE" in
  full)
    LEDGER_ENTRIES=10000000 ADMISSION=200 BURST=2000 FLEET_NODES=5000 FLEET_WORKLOADS=20000
    FLEET_CHANGES=50 ;;
  quick)
    LEDGER_ENTRIES=1000000 ADMISSION=100 BURST=500 FLEET_NODES=1000 FLEET_WORKLOADS=2000
    FLEET_CHANGES=20 ;;
  table)
    OUT="${2:?usage: $0 table DIR}"
    # shellcheck disable=SC1091
    source "$OUT/sizes.env" ;;
  *) echo "usage: $0 [full|quick|table DIR]" >&2; exit 2 ;;
esac
STEPS="${KACCEL_BENCH_ALL_STEPS:-plan ledger admission fleet}"
[[ "$MODE" == table ]] && STEPS=""
OUT="${OUT:-${KACCEL_BENCH_ALL_OUT:-$CACHE/bench-all-$(date +%Y%m%d-%H%M%S)}}"
mkdir -p "$OUT"
cd "$REPO_DIR"
say() { printf '[bench-all %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
runs() { [[ " $STEPS " == *" $1 "* ]]; }
# step NAME COMMAND...: runs COMMAND with its output in $OUT/NAME.log; a failed
# step is said and the others still run.
step() {
  local name="$1" t0=$SECONDS
  shift
  say "$name: $*"
  if "$@" >"$OUT/$name.log" 2>&1; then
    say "$name: done in $((SECONDS - t0)) s"
  else
    say "$name: FAILED (exit $?) after $((SECONDS - t0)) s; see $OUT/$name.log"
  fi
}

if [[ "$MODE" != table ]]; then
  say "mode $MODE, steps: $STEPS; output in $OUT"
  # The sizes, for `table DIR` (not the mode: sourcing them must not run steps).
  declare -p LEDGER_ENTRIES ADMISSION BURST FLEET_NODES FLEET_WORKLOADS FLEET_CHANGES >"$OUT/sizes.env"
  say "building kaccel (release)"
  cargo build --release --quiet --bin kaccel
fi
KACCEL="$CARGO_TARGET_DIR/release/kaccel"

if runs plan; then
  step plan cargo bench --quiet --bench plan -- "plan/nodes/5000|plan/nodes 5000 after a Node|plan/dra nodes" --noplot
fi
if runs ledger; then
  rm -f "$OUT/ledger.db" "$OUT/ledger.db-wal" "$OUT/ledger.db-shm"
  step ledger-sqlite "$KACCEL" ledger bench --store "sqlite://$OUT/ledger.db" --entries "$LEDGER_ENTRIES"
  rm -f "$OUT/ledger.db" "$OUT/ledger.db-wal" "$OUT/ledger.db-shm"
  pg_url="$("$E2E_DIR/postgres.sh" start 2>"$OUT/postgres-start.log")"
  # A fresh database each run: the rate at N entries is the rate of a store of N.
  pg_db="bench_all_$$"
  pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  "$pg_bin/psql" "$pg_url" -qc "CREATE DATABASE $pg_db" >>"$OUT/postgres-start.log" 2>&1
  step ledger-postgres "$KACCEL" ledger bench --store "${pg_url%/*}/$pg_db" --entries "$LEDGER_ENTRIES"
  "$pg_bin/psql" "$pg_url" -qc "DROP DATABASE $pg_db" >>"$OUT/postgres-start.log" 2>&1 || true
  "$E2E_DIR/postgres.sh" stop 2>>"$OUT/postgres-start.log" || true
fi
if runs admission; then
  step admission bash "$E2E_DIR/bench-ledger.sh" "$ADMISSION"
  step admission-burst env KACCEL_BENCH_BURST=1 bash "$E2E_DIR/bench-ledger.sh" "$BURST"
fi
if runs fleet; then
  step fleet env KACCEL_BENCH_CHANGES="$FLEET_CHANGES" \
    bash "$E2E_DIR/bench-controller.sh" scale "$FLEET_NODES" "$FLEET_WORKLOADS"
fi

# ---- the table ----
# grab FILE REGEX [N]: the Nth number (default 1) of the last line matching REGEX.
grab() {
  local file="$OUT/$1" n="${3:-1}"
  [[ -f "$file" ]] || { echo -; return; }
  grep -E "$2" "$file" | tail -n 1 | grep -oE '[0-9]+(\.[0-9]+)?' | sed -n "${n}p" | grep . || echo -
}
# after FILE REGEX WORD: the number right after WORD on the last line matching REGEX.
after() {
  local file="$OUT/$1"
  [[ -f "$file" ]] || { echo -; return; }
  local hit
  hit=$(grep -E "$2" "$file" | tail -n 1 | grep -oE "$3 \+?[0-9]+(\.[0-9]+)?" | head -n 1)
  [[ -n "$hit" ]] || { echo -; return; }
  hit="${hit##* }"
  echo "${hit#+}"
}
# criterion FILE BENCH: the median of a criterion benchmark, in ms.
criterion() {
  local file="$OUT/$1"
  [[ -f "$file" ]] || { echo -; return; }
  awk -v b="$2" '
    index($0, b) == 1 { hit = 1 }
    hit && /time:/ { sub(/.*\[/, ""); split($0, f, " ");
      v = f[3]; u = f[4]; if (u == "s") v *= 1000; else if (u == "µs" || u == "us") v /= 1000;
      printf "%.1f\n", v; exit }' "$file" | grep . || echo -
}
rows=()
# row FIGURE TARGET BASELINE NOW UNIT CHECK: CHECK is "<=N", ">=N" or "" (quoted only).
row() {
  local figure="$1" target="$2" base="$3" now="$4" unit="$5" check="$6" ratio="" verdict=""
  if [[ "$now" != - && "$base" != - && -n "$base" ]]; then
    ratio=$(awk -v a="$now" -v b="$base" 'BEGIN { if (b > 0) printf "%.2fx", a / b }')
  elif [[ "$now" != - && -n "$check" ]]; then
    ratio=$(awk -v a="$now" -v b="${check:2}" 'BEGIN { if (b > 0) printf "%.2fx of target", a / b }')
  fi
  if [[ "$now" != - && -n "$check" ]]; then
    # With a baseline the target is on the ratio (e.g. ">=0.9"), else on the figure.
    local measured="$now"
    [[ "$base" != - && -n "$base" ]] && measured=$(awk -v a="$now" -v b="$base" 'BEGIN { print (b > 0) ? a / b : 0 }')
    verdict=$(awk -v a="$measured" -v op="${check:0:2}" -v b="${check:2}" \
      'BEGIN { ok = (op == "<=") ? (a <= b) : (a >= b); print ok ? "met" : "not met" }')
  fi
  local shown_base="$base"
  [[ -z "$base" ]] && shown_base=""
  [[ "$now" != - ]] && now="$now $unit"
  [[ -n "$shown_base" && "$shown_base" != - ]] && shown_base="$shown_base $unit"
  rows+=("| $figure | $target | $shown_base | $now | $ratio | $verdict |")
}
A=admission.log B=admission-burst.log F=fleet.log S=ledger-sqlite.log P=ledger-postgres.log
added50=$(after $A 'added by the check' 'p50'); added99=$(after $A 'added by the check' 'p99')
row "admission: create -> Admitted p50, $ADMISSION Workloads, 4 in flight" "" \
  "$(after $A 'without \(plain' 'p50')" "$(after $A 'with the credit check' 'p50')" ms ""
row "admission: added by the check, p50" "< 20 ms" "" "$added50" ms "<=20"
row "admission: added by the check, p99" "< 50 ms" "" "$added99" ms "<=50"
row "admission: admissions/s with the check (baseline: without)" ">= 0.9x" \
  "$(after $A 'admissions per second' 'without')" "$(after $A 'admissions per second' 'check')" /s ">=0.9"
row "burst of $BURST: create -> Admitted p50 (baseline: plain queue)" "" \
  "$(after $B 'without \(plain' 'p50')" "$(after $B 'with the credit check' 'p50')" ms ""
row "burst of $BURST: added by the check, p50" "< 20 ms" "" "$(after $B 'added by the check' 'p50')" ms "<=20"
row "burst of $BURST: admissions/s with the check (baseline: without)" ">= 0.9x" \
  "$(after $B 'admissions per second' 'without')" "$(after $B 'admissions per second' 'check')" /s ">=0.9"
for store in SQLite PostgreSQL; do
  f=$S min=50000
  [[ $store == PostgreSQL ]] && f=$P min=30000
  row "$store append, $LEDGER_ENTRIES entries, rate over the last tenth" ">= $min/s" "" \
    "$(after $f 'entries/s overall' 's overall,')" entries/s ">=$min"
  row "$store single-entry durable append, p99" "quoted" "" "$(after $f 'single-entry' 'p99')" ms ""
  row "$store CSV export" ">= 500,000 rows/s" "" "$(after $f '^export csv' '=')" rows/s ">=500000"
  row "$store FOCUS export" ">= 500,000 rows/s" "" "$(after $f '^export focus' '=')" rows/s ">=500000"
  row "$store export peak RSS (CSV then FOCUS, whole process)" "flat" "" \
    "$(awk '/^export focus/ { for (i = 1; i <= NF; i++) if ($i == "KiB" && $(i + 1) == "after") printf "%.1f", $(i - 1) / 1024 }' "$OUT/$f" 2>/dev/null | grep . || echo -)" MiB ""
  row "$store verify of $LEDGER_ENTRIES entries" "< 20 s" "" "$(after $f '^verify' 'in')" s "<=20"
done
row "fleet ($FLEET_NODES Nodes, $FLEET_WORKLOADS Workloads): change -> quota p50" "" "" \
  "$(after $F 'all changes -> quota' 'p50')" ms ""
row "fleet: change -> quota p99" "< 100 ms" "" "$(after $F 'all changes -> quota' 'p99')" ms "<=100"
# The label changes split, same run: the control plane's delivery of the change
# (the bench's own Node watch), then kaccel's part (its write included).
row "fleet: Node label change -> on a watch (the control plane's part), p50 / p99" "" "" \
  "$(after $F "bench's own Node watch" 'p50') / $(after $F "bench's own Node watch" 'p99')" ms ""
row "fleet: on a watch -> quota written (kaccel's part, its write included), p50 / p99" "" "" \
  "$(after $F "seen on the bench's watch ->" 'p50') / $(after $F "seen on the bench's watch ->" 'p99')" ms ""
row "fleet: kaccel CPU per Node label change" "proportional" "" "$(after $F 'per label change:' 'CPU')" ms ""
row "fleet: writes in a quiet minute" "0" "" "$(grab $F 'quiet [0-9]+ s:' 2)" writes "<=0"
row "fleet: missed exporter polls" "0" "" "$(after $F 'quiet [0-9]+ s:' 'missed polls')" polls "<=0"
row "fleet: RSS settled" "< 100 MiB" "" "$(after $F 'memory settled' 'VmRSS')" MiB "<=100"
row "plan: 5,000 device-plugin Nodes, median" "" "" "$(criterion plan.log 'plan/nodes/5000')" ms ""
row "plan: DRA fleet, 5,000 Nodes, median (the DRA issue's target)" "20 ms" "" "$(criterion plan.log 'plan/dra nodes')" ms "<=20"
# As the controller re-plans after one Node change (the last LocalQueues kept).
row "plan: 5,000 device-plugin Nodes after a Node change, median" "" "" \
  "$(criterion plan.log 'plan/nodes 5000 after a Node change')" ms ""
row "plan: DRA fleet after a Node change, median" "20 ms" "" \
  "$(criterion plan.log 'plan/dra nodes 5000 after a Node change')" ms "<=20"
{
  echo "Benchmarks ($(basename "$OUT")), $(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$REPO_DIR" rev-parse --short HEAD), $(nproc) cores"
  echo
  echo "| figure | target | baseline (same run) | now | ratio | |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/table.md"
