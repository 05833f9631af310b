#!/usr/bin/env bash
# Simulated Nodes for a cluster without kubelets.
#
#   e2e/nodes.sh [apply] [FILE]   create/update the Nodes in FILE (multi-document
#                                 YAML of v1 Nodes; default examples/nodes.yaml)
#                                 with their status (capacity, allocatable,
#                                 conditions); Nodes without conditions get
#                                 Ready=True, and condition times the file leaves
#                                 out are set to now
#   e2e/nodes.sh heartbeat        fresh lastHeartbeatTime on every condition of
#                                 every Node (Ready=True where none)
#
# Status is written on create, or through the status subresource with
# server-side apply; the file is split into chunks applied in parallel
# (KACCEL_E2E_NODE_JOBS, default 8).
# Uses $KUBECONFIG, else the local harness's kubeconfig (e2e/cluster.sh).
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
RUN="${KACCEL_E2E_RUN:-$CACHE/run}"
JOBS="${KACCEL_E2E_NODE_JOBS:-8}"
export KUBECONFIG="${KUBECONFIG:-$RUN/kubeconfig}"
if [[ -f "$RUN/bin-dir" && -x "$(cat "$RUN/bin-dir")/kubectl" ]]; then
  KUBECTL="$(cat "$RUN/bin-dir")/kubectl"
else
  KUBECTL="$(command -v kubectl)" || {
    echo "nodes.sh: no kubectl (run e2e/cluster.sh up first)" >&2
    exit 1
  }
fi
kc() { "$KUBECTL" "$@"; }
log() { printf '[nodes %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Condition stamps as one YAML stream of status patches, from lines
#   <node> [<type>=<flags> ...]
# where flags H / T set lastHeartbeatTime / lastTransitionTime to now on that
# condition (its status, reason and message are left as they are); a line
# with no types adds Ready=True.
stamp_docs() {
  local now name rest c type flags
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  while read -r name rest; do
    name="${name#node/}"
    [[ -n "$name" ]] || continue
    printf -- '---\napiVersion: v1\nkind: Node\nmetadata:\n  name: %s\nstatus:\n  conditions:\n' "$name"
    if [[ -z "$rest" ]]; then
      printf '  - type: Ready\n    status: "True"\n    reason: KubeletReady\n'
      printf '    message: simulated node (kaccel e2e harness, no kubelet)\n'
      printf '    lastHeartbeatTime: "%s"\n    lastTransitionTime: "%s"\n' "$now" "$now"
      continue
    fi
    for c in $rest; do
      type="${c%%=*}" flags="${c#*=}"
      printf '  - type: %s\n' "$type"
      [[ "$flags" != *H* ]] || printf '    lastHeartbeatTime: "%s"\n' "$now"
      [[ "$flags" != *T* ]] || printf '    lastTransitionTime: "%s"\n' "$now"
    done
  done
}

# stamp <field manager>: apply stamp_docs of stdin to the status subresource.
# `apply` and `heartbeat` use different managers: server-side apply removes a
# field when the manager that set it stops sending it.
stamp() {
  stamp_docs | kc apply --server-side --force-conflicts --field-manager="$1" \
    --subresource=status -f - >/dev/null
}

# Fresh-cluster fast path: one POST per Node (create keeps status, as for a
# kubelet registering), with the Ready condition injected into each document.
# Nodes that already exist get a server-side apply of the object and of its
# status subresource instead. Documents that give status.conditions keep them
# as given, except that missing lastHeartbeatTime/lastTransitionTime are set to
# now (block-style conditions only); flow-style `status: {...}` without
# conditions gets Ready=True in a separate pass.
apply_chunk() { # apply_chunk <file>
  local f=$1
  if ! kc create -f "$f" -o name >"$f.names" 2>"$f.create-err"; then
    if grep -v 'AlreadyExists' "$f.create-err" | grep -q .; then
      cat "$f.create-err" >&2
      return 1
    fi
    kc apply --server-side --force-conflicts --field-manager=kaccel-e2e-nodes -f "$f" -o name >"$f.names"
    kc apply --server-side --force-conflicts --field-manager=kaccel-e2e-nodes --subresource=status -f "$f" >/dev/null
  fi
  if [[ -s "$f.stamps" ]]; then
    stamp kaccel-e2e-nodes-stamp <"$f.stamps"
  fi
}

cmd_apply() {
  local file="${1:-$REPO_DIR/examples/nodes.yaml}" tmp t0 n i rc=0
  [[ -f "$file" ]] || {
    echo "nodes.sh: no such file: $file" >&2
    exit 1
  }
  t0=$(date +%s%N)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  # Split into $JOBS chunks, round robin by document; skip empty documents;
  # add a Ready condition under each block-style `status:` (see apply_chunk).
  awk -v dir="$tmp" -v jobs="$JOBS" -v now="$(date -u +%Y-%m-%dT%H:%M:%SZ)" '
    function ready(ind) {
      return ind "conditions:\n" ind "- type: Ready\n" ind "  status: \"True\"\n" ind "  reason: KubeletReady\n" \
        ind "  message: simulated node (kaccel e2e harness, no kubelet)\n" \
        ind "  lastHeartbeatTime: \"" now "\"\n" ind "  lastTransitionTime: \"" now "\"\n"
    }
    function flush(  i, out, ind, done, name, chunk) {
      if (nl == 0 || !kind) { nl = 0; kind = 0; return }
      chunk = dir "/chunk-" (n % jobs) ".yaml"; n++
      out = "---\n"; done = 0; name = ""
      for (i = 1; i <= nl; i++) {
        out = out line[i] "\n"
        if (line[i] ~ /^  name:/ && name == "" && inmeta[i]) { name = line[i]; sub(/^  name:[ \t]*/, "", name); gsub(/["\047]/, "", name) }
        if (line[i] ~ /^status:[ \t]*$/ && !hascond) {
          ind = "  "
          if (i < nl && match(line[i + 1], /^ +/)) ind = substr(line[i + 1], 1, RLENGTH)
          out = out ready(ind); done = 1
        }
      }
      if (!done && !hasstatus) { out = out "status:\n" ready("  "); done = 1 }
      printf "%s", out > chunk
      if (hascond) { citem(); if (stamps != "") print name stamps > (chunk ".stamps") }
      else if (!done) print name > (chunk ".stamps")
      nl = 0; kind = 0
    }
    # conditions given in the file: note the times they leave out
    function citem(  t, f) {
      if (item == "") return
      if (match(item, /type:[ \t]*["\047]?[A-Za-z0-9._\/-]+/)) {
        t = substr(item, RSTART, RLENGTH); sub(/type:[ \t]*["\047]?/, "", t)
        f = (item ~ /lastHeartbeatTime:/ ? "" : "H") (item ~ /lastTransitionTime:/ ? "" : "T")
        if (f != "") stamps = stamps " " t "=" f
      }
      item = ""
    }
    /^---/ { flush(); hasstatus = 0; hascond = 0; meta = 0; cs = 0; item = ""; stamps = ""; next }
    { line[++nl] = $0 }
    /^kind:/ { kind = 1 }
    /^metadata:/ { meta = 1 } /^[a-z]/ && !/^metadata:/ { meta = 0 }
    { inmeta[nl] = meta }
    /^status:/ { hasstatus = 1; st = 1; if ($0 ~ /conditions/) hascond = 1; next } /^[a-z]/ { st = 0; citem(); cs = 0 }
    cs && /^[ ]*- / { match($0, /^[ ]*/); if (RLENGTH >= cind) { citem(); item = $0; next } }
    cs && /^[ ]*[a-zA-Z]/ { match($0, /^[ ]*/); if (RLENGTH <= cind) { citem(); cs = 0 } else { item = item "\n" $0 } }
    st && /^[ ]+conditions:/ { hascond = 1; if ($0 ~ /conditions:[ \t]*$/) { cs = 1; match($0, /^[ ]*/); cind = RLENGTH } }
    END { flush(); print n > (dir "/count") }' "$file"
  n="$(cat "$tmp/count")"
  ((n > 0)) || {
    log "no Node documents in $file"
    return 1
  }
  local chunks=("$tmp"/chunk-*.yaml) pids=()
  log "applying $n nodes from $file in ${#chunks[@]} parallel chunks"
  for f in "${chunks[@]}"; do
    apply_chunk "$f" 2>"$f.err" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[i]}"; then
      rc=1
    fi
  done
  if ((rc != 0)); then
    cat "$tmp"/chunk-*.err >&2
    log "FAILED to apply some nodes from $file"
    return 1
  fi
  local ms=$((($(date +%s%N) - t0) / 1000000))
  log "applied $n nodes (object + status + Ready) in ${ms} ms ($((n * 1000 / (ms > 0 ? ms : 1))) nodes/s)"
}

cmd_heartbeat() {
  local tmp f rc=0 pids=()
  tmp="$(mktemp -d)"
  # every condition of every node gets a fresh lastHeartbeatTime; nodes
  # without conditions get Ready=True
  kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}{range .status.conditions[*]}{" "}{.type}{"=H"}{end}{"\n"}{end}' >"$tmp/stamps"
  split -n "r/$JOBS" "$tmp/stamps" "$tmp/part-"
  for f in "$tmp"/part-*; do
    [[ -s "$f" ]] || continue
    stamp kaccel-e2e-heartbeat <"$f" &
    pids+=($!)
  done
  for f in "${pids[@]}"; do wait "$f" || rc=1; done
  log "refreshed the heartbeat of $(wc -l <"$tmp/stamps") nodes"
  rm -rf "$tmp"
  return $rc
}

case "${1:-}" in
heartbeat) cmd_heartbeat ;;
apply)
  shift
  cmd_apply "$@"
  ;;
-h | --help)
  sed -n '2,16p' "$0"
  ;;
*) cmd_apply "$@" ;;
esac
