#!/usr/bin/env bash
# The long form of tests/fuzz.rs: every target with many cases from one fixed
# seed, in a release build, one target at a time so each one's peak memory is
# its own.
#
#   e2e/fuzz.sh [CASES] [SEED]      defaults: 1000000 cases, seed 20261205
#
# Prints one line per target: cases, seconds, maximum resident memory (GNU time).
# Exits non-zero on the first failure (proptest prints the shrunk input; rerun
# with the same CASES and SEED to repeat it).
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(dirname "$E2E_DIR")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kaccel-target}"
CASES="${1:-1000000}"
SEED="${2:-20261205}"
TARGETS=(exposition_text_never_panics query_answers_never_panic plan_yaml_never_panics exports_round_trip_any_entry)

[[ -x /usr/bin/time ]] || { echo "fuzz.sh: needs GNU time (/usr/bin/time; Debian package 'time')" >&2; exit 1; }
cargo test --release --test fuzz --no-run 2>&1 | tail -1 >&2
bin="$(cargo test --release --test fuzz --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\/fuzz-[^"]*\)".*/\1/p' | tail -1)"
[[ -x "$bin" ]] || { echo "fuzz.sh: no test binary found" >&2; exit 1; }

printf 'tests/fuzz.rs, %s cases per target, seed %s, release build\n' "$CASES" "$SEED"
for target in "${TARGETS[@]}"; do
  out="$(mktemp)"
  if ! KACCEL_FUZZ_CASES="$CASES" KACCEL_FUZZ_SEED="$SEED" /usr/bin/time -f '%e %M' -o "$out.time" \
    "$bin" --exact "$target" --test-threads 1 >"$out" 2>&1; then
    cat "$out" >&2
    echo "FAILED: $target (cases $CASES, seed $SEED)" >&2
    exit 1
  fi
  read -r seconds max_kib <"$out.time"
  printf '  %-32s %9s cases  %8.1f s  max RSS %6.1f MiB\n' "$target" "$CASES" "$seconds" "$(echo "$max_kib / 1024" | bc -l)"
  rm -f "$out" "$out.time"
done
