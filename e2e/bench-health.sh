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
# shellcheck source=e2e/bench-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
bench_cluster bench-health 25791 25792 27543 30543 29544 29181 29182
cargo test --features e2e --test e2e reaction_time_over_20_faults -- --ignored --nocapture 2>&1 \
  | grep -E 'MEASURE|test result|panicked|timed out|Error:|error:'
