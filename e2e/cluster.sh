#!/usr/bin/env bash
# A real, local control plane for kaccel's end-to-end tests:
# etcd + kube-apiserver + kube-controller-manager (Job, ServiceAccount and
# ResourceClaim controllers only) + kube-scheduler (only for pods that name
# schedulerName kaccel-e2e-scheduler) + the Kueue manager, all built by e2e/build.sh.
# No kubelet: Nodes are API objects (see nodes.sh), pods stay Pending (bound, for
# the scheduler's pods).
#
#   e2e/cluster.sh up       start (idempotent: says so when already up)
#   e2e/cluster.sh down     stop (SIGTERM, wait, SIGKILL); logs are kept
#   e2e/cluster.sh status   what runs, and whether it answers
#   e2e/cluster.sh env      prints exports for: eval "$(e2e/cluster.sh env)"
#   e2e/cluster.sh identity kaccel's ServiceAccount, RBAC (manifests/) and token
#                           kubeconfig in a cluster this script did not start
#                           (KUBECONFIG: its admin); `up` does it too
#   e2e/cluster.sh restart etcd|kube-apiserver|kueue
#                           SIGKILL one component, start it again, wait until it
#                           serves; prints the seconds it was down
#   e2e/cluster.sh kill NAME   SIGKILL one component and leave it down
#   e2e/cluster.sh start NAME  start a killed component again (its recorded
#                           command line) and wait until it serves
#
# Environment:
#   KACCEL_E2E_CACHE   build cache            (default ~/.cache/kaccel-e2e)
#   KACCEL_E2E_RUN     run folder: pids, logs, certs, kubeconfig, etcd data
#                                             (default $KACCEL_E2E_CACHE/run)
#   KACCEL_E2E_ETCD_CLIENT_PORT, KACCEL_E2E_ETCD_PEER_PORT, KACCEL_E2E_APISERVER_PORT,
#   KACCEL_E2E_KUEUE_WEBHOOK_PORT, KACCEL_E2E_KUEUE_METRICS_PORT,
#   KACCEL_E2E_KUEUE_HEALTH_PORT, KACCEL_E2E_SCHEDULER_PORT
#                                            ports (defaults in versions.env)
#   KACCEL_E2E_TIMEOUT seconds to wait for each component (default 180)
#   KACCEL_E2E_NO_KACCEL_CRDS=1  do not install crds/*.yaml (harness checks only)
#   KACCEL_E2E_KUEUE_GATES  more Kueue feature gates, e.g.
#                           WorkloadRequestUseMergePatch=true (measurements only)
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$E2E_DIR")"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
KUEUE_VERSION="${KACCEL_E2E_KUEUE_VERSION:-$KUEUE_VERSION}"

CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
RUN="${KACCEL_E2E_RUN:-$CACHE/run}"
ETCD_PORT="${KACCEL_E2E_ETCD_CLIENT_PORT:-$KACCEL_E2E_ETCD_CLIENT_PORT_DEFAULT}"
PEER_PORT="${KACCEL_E2E_ETCD_PEER_PORT:-$KACCEL_E2E_ETCD_PEER_PORT_DEFAULT}"
API_PORT="${KACCEL_E2E_APISERVER_PORT:-$KACCEL_E2E_APISERVER_PORT_DEFAULT}"
WEBHOOK_PORT="${KACCEL_E2E_KUEUE_WEBHOOK_PORT:-$KACCEL_E2E_KUEUE_WEBHOOK_PORT_DEFAULT}"
METRICS_PORT="${KACCEL_E2E_KUEUE_METRICS_PORT:-$KACCEL_E2E_KUEUE_METRICS_PORT_DEFAULT}"
HEALTH_PORT="${KACCEL_E2E_KUEUE_HEALTH_PORT:-$KACCEL_E2E_KUEUE_HEALTH_PORT_DEFAULT}"
SCHEDULER_PORT="${KACCEL_E2E_SCHEDULER_PORT:-$KACCEL_E2E_SCHEDULER_PORT_DEFAULT}"
TIMEOUT="${KACCEL_E2E_TIMEOUT:-180}"
# Kueue v0.17.0 reads its metrics serving cert from this fixed path whenever
# internalCertManagement is off (cmd/kueue/main.go); it is not configurable.
KUEUE_METRICS_CERTS=/etc/kueue/metrics/certs
# The DRA-only flavors tests/e2e/dra.rs plans (their products are the tests'):
# Kueue counts claims of their DeviceClasses only if it is started mapping them.
E2E_DRA_FLAVORS=(nvidia-e2e-dra-h100 amd-e2e-dra-mi300x)
# The vendor device resources Kueue also counts as kaccel.io/accelerator (one
# device, one count): those of the example fleet and the tests' fleets, as
# `kaccel plan -f examples --kueue-config` prints them (tests/manifests.rs checks).
E2E_CLASS_COUNTED=(amd.com/gpu aws.amazon.com/neuron google.com/tpu habana.ai/gaudi huawei.com/Ascend910 nvidia.com/gpu nvidia.com/mig-1g.10gb)
# The scheduler's only profile: pods that do not name it are never scheduled, so
# the tests that count Pending pods see what they saw before it ran.
E2E_SCHEDULER_NAME=kaccel-e2e-scheduler
# DRA gates shared by the API server, the scheduler and the controller manager:
# device taints (kaccel's DeviceTaintRules) and extended resources backed by DRA.
E2E_DRA_GATES=DRADeviceTaints=true,DRADeviceTaintRules=true,DRAExtendedResource=true
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kueue) # start order; stopped in reverse

PKI="$RUN/pki"
KUBECONFIG_FILE="$RUN/kubeconfig"
T0=$(date +%s)
log() { printf '[cluster %s +%3ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

bin_dir() { "$E2E_DIR/build.sh" | tail -1; }

# ------------------------------------------------------------------ processes
pid_of() { # prints the pid of a running component, or fails
  local f="$RUN/$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ -n "$pid" && -d "/proc/$pid" ]] || return 1
  # guard against a recycled pid: the process must run our binary
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "/$1 " || return 1
  echo "$pid"
}

start() { # start <name> <binary> <args...>: detached, own session, log in $RUN
  local name=$1
  shift
  log "starting $name (log: $RUN/$name.log)"
  echo "=== $(date -Is) $*" >>"$RUN/$name.log"
  # The command line, for `restart` (a fault injected mid-run).
  printf '%q ' "$@" >"$RUN/$name.cmd"
  setsid "$@" </dev/null >>"$RUN/$name.log" 2>&1 &
  local pid=$! i
  echo "$pid" >"$RUN/$name.pid"
  # Until the forked shell has exec'd the binary, /proc/<pid>/cmdline still
  # shows this script, and pid_of (which checks the binary to guard against a
  # recycled pid) would report the component as exited. On a busy machine that
  # window is long enough to lose the race, so wait for the exec here: of the
  # binary itself, first on the command line. A wrapper names it too (`env
  # KUBECONFIG=... kueue`), and while the wrapper execs it the command line
  # reads empty for a moment: CI's Kueue v0.16.6 pass was reported exited
  # there, and stopped, before it had logged a line.
  for ((i = 0; i < 200; i++)); do
    [[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)" == */"$name" ]] && return 0
    [[ -d "/proc/$pid" ]] || return 0 # exited already: wait_for shows its log
    sleep 0.05
  done
}

stop() { # stop <name>: SIGTERM, wait up to 20s, then SIGKILL
  local name=$1 pid i
  if ! pid="$(pid_of "$name")"; then
    rm -f "$RUN/$name.pid"
    return 0
  fi
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    [[ -d "/proc/$pid" ]] || break
    sleep 0.1
  done
  if [[ -d "/proc/$pid" ]]; then
    log "$name did not stop after SIGTERM, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while [[ -d "/proc/$pid" ]]; do sleep 0.1; done
  fi
  rm -f "$RUN/$name.pid"
}

wait_for() { # wait_for <what> <component> <cmd...>: poll until cmd succeeds
  local what=$1 comp=$2 deadline=$(($(date +%s) + TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    # Asked twice: a process between two execs shows no command line briefly.
    if ! pid_of "$comp" >/dev/null && ! { sleep 0.2 && pid_of "$comp" >/dev/null; }; then
      tail -n 40 "$RUN/$comp.log" >&2 || true
      die "$comp exited while waiting for $what (log: $RUN/$comp.log)"
    fi
    if (($(date +%s) > deadline)); then
      tail -n 40 "$RUN/$comp.log" >&2 || true
      die "timed out after ${TIMEOUT}s waiting for $what (log: $RUN/$comp.log)"
    fi
    sleep 0.2
  done
  log "$what: ready"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

check_ports() {
  local spec port var
  for spec in "$ETCD_PORT:KACCEL_E2E_ETCD_CLIENT_PORT" "$PEER_PORT:KACCEL_E2E_ETCD_PEER_PORT" \
    "$API_PORT:KACCEL_E2E_APISERVER_PORT" "$WEBHOOK_PORT:KACCEL_E2E_KUEUE_WEBHOOK_PORT" \
    "$METRICS_PORT:KACCEL_E2E_KUEUE_METRICS_PORT" "$HEALTH_PORT:KACCEL_E2E_KUEUE_HEALTH_PORT" \
    "$SCHEDULER_PORT:KACCEL_E2E_SCHEDULER_PORT"; do
    port=${spec%%:*} var=${spec#*:}
    port_free "$port" || die "port $port is already in use on 127.0.0.1; stop whatever holds it or choose another port: export $var=<port>"
  done
}

# ---------------------------------------------------------------------- certs
make_certs() {
  [[ -f "$PKI/.complete" ]] && return 0
  log "creating certificates in $PKI"
  rm -rf "$PKI"
  mkdir -p "$PKI/kueue-webhook"
  (
    cd "$PKI"
    umask 077
    key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
    sign() { # sign <name> <subject> [subjectAltName]
      key "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
      {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [[ -n "${3:-}" ]]; then
          echo "extendedKeyUsage=serverAuth,clientAuth"
          echo "subjectAltName=$3"
        else
          echo "extendedKeyUsage=clientAuth"
        fi
      } >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    key ca.key
    openssl req -x509 -new -key ca.key -subj "/CN=kaccel-e2e-ca" -days 3650 -out ca.crt \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    sign apiserver "/CN=kube-apiserver" \
      "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    sign admin "/O=system:masters/CN=kaccel-e2e-admin"
    sign kueue "/CN=kueue-webhook" "IP:127.0.0.1,DNS:localhost"
    cp kueue.crt kueue-webhook/tls.crt
    cp kueue.key kueue-webhook/tls.key
    key sa.key
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    touch .complete
  ) || die "certificate generation with openssl failed"
}

install_metrics_certs() {
  # Any valid cert/key pair will do; we install ours (127.0.0.1) when the
  # folder is writable, or through passwordless sudo.
  local c="$KUEUE_METRICS_CERTS"
  if mkdir -p "$c" 2>/dev/null && cp "$PKI/kueue.crt" "$c/tls.crt" 2>/dev/null && cp "$PKI/kueue.key" "$c/tls.key" 2>/dev/null; then
    return 0
  fi
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n mkdir -p "$c" && sudo -n cp "$PKI/kueue.crt" "$c/tls.crt" && sudo -n cp "$PKI/kueue.key" "$c/tls.key" &&
      sudo -n chmod 0644 "$c/tls.crt" "$c/tls.key" && return 0
  fi
  [[ -r "$c/tls.crt" && -r "$c/tls.key" ]] && {
    log "using the existing $c/tls.{crt,key}"
    return 0
  }
  die "Kueue ${KUEUE_VERSION} insists on reading $c/tls.{crt,key}; this user cannot write there. Run once as root: mkdir -p $c && cp $PKI/kueue.crt $c/tls.crt && cp $PKI/kueue.key $c/tls.key && chmod 0644 $c/*"
}

write_kubeconfig() {
  local b64='base64 -w0'
  cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kaccel-e2e
  cluster:
    server: https://127.0.0.1:${API_PORT}
    certificate-authority-data: $($b64 <"$PKI/ca.crt")
users:
- name: kaccel-e2e-admin
  user:
    client-certificate-data: $($b64 <"$PKI/admin.crt")
    client-key-data: $($b64 <"$PKI/admin.key")
contexts:
- name: kaccel-e2e
  context:
    cluster: kaccel-e2e
    user: kaccel-e2e-admin
current-context: kaccel-e2e
EOF
  chmod 600 "$KUBECONFIG_FILE"
}

# Kueue's webhook manifests point at an in-cluster Service; we rewrite each
# clientConfig to url: https://127.0.0.1:<port><path> with our CA, and keep
# only the webhooks for kinds that this Kueue serves (its own API group and
# batch/v1 Job, the one integration we enable). The manifests are
# controller-gen output, so their layout is stable enough for awk.
webhook_manifests() {
  awk -v url="https://127.0.0.1:${WEBHOOK_PORT}" -v ca="$(base64 -w0 <"$PKI/ca.crt")" '
    function flush(  i) { if (keep) for (i = 1; i <= n; i++) print buf[i]; n = 0; keep = 0 }
    /^---/ { flush(); inwh = 0; print; next }
    !inwh { sub(/^  name: /, "  name: kaccel-e2e-kueue-"); print; if ($0 ~ /^webhooks:/) inwh = 1; next }
    /^- / { flush() }
    /^    service:$/ { skip = 1; next }
    skip && /^      (name|namespace):/ { next }
    skip && /^      path:/ { buf[++n] = "    caBundle: " ca; buf[++n] = "    url: " url $2; skip = 0; next }
    /^    - (kueue\.x-k8s\.io|batch)$/ { keep = 1 }
    { buf[++n] = $0 }
    END { flush() }' "$BIN/kueue-webhooks.yaml"
}

write_kueue_config() {
  # KACCEL_E2E_KUEUE_GATES: more Kueue feature gates, comma-separated Name=bool
  # (a measurement's variant; the suite runs without).
  local KUEUE_EXTRA_GATES="" gate gates="${KACCEL_E2E_KUEUE_GATES:-}"
  for gate in ${gates//,/ }; do
    KUEUE_EXTRA_GATES+="  ${gate%%=*}: ${gate#*=}"$'\n'
  done
  cat >"$RUN/kueue-config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:${HEALTH_PORT}
metrics:
  bindAddress: 127.0.0.1:${METRICS_PORT}
webhook:
  host: 127.0.0.1
  port: ${WEBHOOK_PORT}
  certDir: ${PKI}/kueue-webhook
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
# Kueue's controllers as its own manifests configure them
# (config/components/manager/controller_manager_config.yaml, v0.16 and v0.17):
# left out, controller-runtime runs one Workload reconcile at a time, and in a
# burst the Workload controller (which lists admission checks and turns Ready
# checks into Admitted) falls tens of seconds behind the scheduler.
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
# Above Kueue's shipped 50 / 100, so the suite is not paced by its client.
clientConnection:
  qps: 200
  burst: 400
integrations:
  frameworks:
  - batch/job
fairSharing:
  preemptionStrategies:
  - LessThanOrEqualToFinalShare
  - LessThanInitialShare
featureGates:
  VisibilityOnDemand: false
  # Topology Aware Scheduling (beta, on by default since v0.14; named so the
  # harness does not depend on the default): kaccel writes Topology objects.
  TopologyAwareScheduling: true
  # Count devices requested through ResourceClaimTemplates (alpha in v0.17).
  DynamicResourceAllocation: true
${KUEUE_EXTRA_GATES}
# Kueue reads these only when it starts: the DRA flavors the e2e tests plan, as
# kaccel plan --kueue-config prints them (E2E_DRA_FLAVORS; tests/e2e/dra.rs).
# Every kaccel DeviceClass's claims count as the class resource (one device, one
# count: a DRA flavor's quota is in kaccel.io/accelerator alone).
resources:
  deviceClassMappings:
  - name: kaccel.io/accelerator
    deviceClassNames:
$(for f in "${E2E_DRA_FLAVORS[@]}"; do printf '    - %s.kaccel.io\n' "$f"; done)
  transformations:
$(for r in "${E2E_CLASS_COUNTED[@]}"; do printf '  - input: %s\n    strategy: Retain\n    outputs:\n      kaccel.io/accelerator: "1"\n' "$r"; done)
EOF
}

write_scheduler_config() {
  cat >"$RUN/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: ${KUBECONFIG_FILE}
leaderElection:
  leaderElect: false
profiles:
- schedulerName: ${E2E_SCHEDULER_NAME}
EOF
}

curl_api() { curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:${API_PORT}$1"; }
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

probe_clusterqueue() { # server-side dry run: goes through Kueue's webhooks
  kc create --dry-run=server -f - <<'EOF'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: kaccel-e2e-readiness-probe
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["cpu"]
    flavors:
    - name: probe
      resources:
      - name: cpu
        nominalQuota: "1"
EOF
}

all_up() {
  local c
  for c in "${COMPONENTS[@]}"; do pid_of "$c" >/dev/null || return 1; done
  curl_api /readyz >/dev/null 2>&1 && curl -fsS --max-time 5 "http://127.0.0.1:${HEALTH_PORT}/readyz" >/dev/null 2>&1
}

# ------------------------------------------------------------------- commands
cmd_up() {
  mkdir -p "$RUN"
  if [[ -f "$PKI/.complete" ]] && all_up; then
    log "already up (run folder $RUN); KUBECONFIG=$KUBECONFIG_FILE"
    return 0
  fi
  local c
  for c in "${COMPONENTS[@]}"; do
    if pid_of "$c" >/dev/null; then
      log "a partial cluster is running in $RUN: taking it down first"
      cmd_down
      break
    fi
  done
  check_ports
  # On any failure from here on, stop what was started (logs are kept).
  trap 'rc=$?; ((rc == 0)) || { log "up failed: stopping what was started"; cmd_down; }' EXIT
  BIN="$(bin_dir)"
  [[ -x "$BIN/kueue" ]] || die "no built binaries in '$BIN' (e2e/build.sh failed?)"
  log "binaries: $BIN"
  log "run folder: $RUN"
  make_certs
  install_metrics_certs
  write_kubeconfig
  echo "$BIN" >"$RUN/bin-dir"

  rm -rf "$RUN/etcd-data"
  start etcd "$BIN/etcd" --name kaccel-e2e --data-dir "$RUN/etcd-data" \
    --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${PEER_PORT}" \
    --initial-cluster "kaccel-e2e=http://127.0.0.1:${PEER_PORT}" --initial-cluster-state new \
    --unsafe-no-fsync --quota-backend-bytes 8589934592 --log-level warn
  wait_for "etcd http://127.0.0.1:${ETCD_PORT}/health" etcd \
    bash -c "curl -fsS --max-time 2 http://127.0.0.1:${ETCD_PORT}/health | grep -q '\"health\":\"true\"'"

  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "${API_PORT}" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true \
    --max-requests-inflight 800 --max-mutating-requests-inflight 400 \
    --disable-admission-plugins TaintNodesByCondition \
    --runtime-config resource.k8s.io/v1alpha3=true \
    --feature-gates "$E2E_DRA_GATES" \
    --profiling=false --v=1
  wait_for "kube-apiserver https://127.0.0.1:${API_PORT}/readyz" kube-apiserver curl_api /readyz
  log "API server version: $(curl_api /version | sed -n 's/.*"gitVersion": "\([^"]*\)".*/\1/p')"

  # Jobs create their pods (the Job controller), every namespace gets the
  # "default" ServiceAccount those pods run as (the ServiceAccount admission
  # plugin refuses pods without it), and a pod's ResourceClaimTemplates become
  # ResourceClaims (the ResourceClaim controller). No kubelet: pods stay Pending.
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$KUBECONFIG_FILE" --controllers job-controller,serviceaccount-controller,resourceclaim-controller \
    --feature-gates "$E2E_DRA_GATES" \
    --leader-elect=false --secure-port 0 --use-service-account-credentials=false --v=1
  wait_for "kube-controller-manager (the default ServiceAccount exists)" kube-controller-manager \
    kc -n default get serviceaccount default

  # The real DRA allocator: it evaluates kaccel's DeviceClass CEL against the
  # ResourceSlices and honours DeviceTaintRules, binding pods to simulated nodes.
  write_scheduler_config
  start kube-scheduler "$BIN/kube-scheduler" --config "$RUN/kube-scheduler.yaml" \
    --feature-gates "$E2E_DRA_GATES" \
    --bind-address 127.0.0.1 --secure-port "${SCHEDULER_PORT}" --cert-dir "$RUN/kube-scheduler-certs" --v=1
  wait_for "kube-scheduler (serving its healthz)" kube-scheduler \
    curl -fsSk --max-time 2 "https://127.0.0.1:${SCHEDULER_PORT}/healthz"

  kc apply --server-side -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: kueue-system
EOF
  kc apply --server-side -f "$BIN/kueue-crds/" >/dev/null
  if [[ "${KACCEL_E2E_NO_KACCEL_CRDS:-}" == 1 ]]; then
    log "KACCEL_E2E_NO_KACCEL_CRDS=1: not installing kaccel's CRDs"
  elif compgen -G "$REPO_DIR/crds/*.yaml" >/dev/null; then
    log "installing kaccel CRDs from $REPO_DIR/crds/"
    kc apply --server-side -f "$REPO_DIR/crds/" >/dev/null ||
      die "the API server rejected kaccel's CRDs in $REPO_DIR/crds/ (see above)"
  fi
  # (kubectl wait fails outright on a CRD whose status is not written yet: poll it)
  wait_for "CRDs established" kube-apiserver kc wait --for condition=Established crd --all --timeout 10s
  log "CRDs installed: $(kc get crd -o name | wc -l)"
  webhook_manifests >"$RUN/kueue-webhooks.yaml"
  kc apply --server-side -f "$RUN/kueue-webhooks.yaml" >/dev/null
  log "registered Kueue webhooks at https://127.0.0.1:${WEBHOOK_PORT} ($(grep -c '^    url:' "$RUN/kueue-webhooks.yaml") endpoints)"

  write_kueue_config
  start kueue env KUBECONFIG="$KUBECONFIG_FILE" "$BIN/kueue" --config "$RUN/kueue-config.yaml"
  wait_for "kueue http://127.0.0.1:${HEALTH_PORT}/readyz" kueue \
    curl -fsS --max-time 2 "http://127.0.0.1:${HEALTH_PORT}/readyz"
  wait_for "kueue admits a ClusterQueue (server-side dry run through its webhooks)" kueue probe_clusterqueue
  # Kueue's metrics endpoint authenticates bearer tokens only (TokenReview):
  # a service account allowed to GET /metrics, and a token for it.
  kc apply --server-side -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kaccel-e2e-metrics-reader
  namespace: kueue-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kaccel-e2e-metrics-reader
rules:
- nonResourceURLs: ["/metrics"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kaccel-e2e-metrics-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kaccel-e2e-metrics-reader
subjects:
- kind: ServiceAccount
  name: kaccel-e2e-metrics-reader
  namespace: kueue-system
EOF
  kc -n kueue-system create token kaccel-e2e-metrics-reader --duration 48h >"$RUN/kueue-metrics-token"
  log "Kueue metrics: curl --cacert $PKI/ca.crt -H \"Authorization: Bearer \$(cat $RUN/kueue-metrics-token)\" https://127.0.0.1:${METRICS_PORT}/metrics"
  controller_identity "$KUBECONFIG_FILE"
  trap - EXIT
  log "cluster up in $(($(date +%s) - T0))s; use: eval \"\$($0 env)\""
}

cmd_down() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[i]}"; done
  rm -rf "$RUN/etcd-data" # every `up` starts from an empty etcd anyway
  log "down (logs kept in $RUN)"
}

cmd_status() {
  local c pid rc=0
  echo "run folder: $RUN"
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$c")"; then
      echo "  $c: running (pid $pid)"
    else
      echo "  $c: stopped"
      rc=1
    fi
  done
  if [[ -f "$PKI/.complete" ]]; then
    curl_api /readyz >/dev/null 2>&1 && echo "  apiserver https://127.0.0.1:${API_PORT}/readyz: ok" || echo "  apiserver https://127.0.0.1:${API_PORT}: not answering"
  fi
  curl -fsS --max-time 2 "http://127.0.0.1:${HEALTH_PORT}/readyz" >/dev/null 2>&1 &&
    echo "  kueue http://127.0.0.1:${HEALTH_PORT}/readyz: ok" || echo "  kueue http://127.0.0.1:${HEALTH_PORT}/readyz: not answering"
  return $rc
}

# kaccel's own identity, from the same files a platform team installs: the
# manifests' Namespace, ServiceAccount, ClusterRole, Roles and bindings, and a
# token for that ServiceAccount (TokenRequest, 48 h) in a kubeconfig holding
# nothing else: $RUN/kaccel.kubeconfig, which every e2e `kaccel run` and the demo
# use. A verb the manifests lack fails the tests that need it.
controller_identity() { # controller_identity ADMIN_KUBECONFIG
  local admin=$1 m="$REPO_DIR/manifests" server ca token
  local k=(--kubeconfig "$admin")
  "$BIN/kubectl" "${k[@]}" apply --server-side --force-conflicts -f "$m/namespace.yaml" -f "$m/serviceaccount.yaml" \
    -f "$m/clusterrole.yaml" -f "$m/clusterrolebinding.yaml" -f "$m/role.yaml" -f "$m/rolebinding.yaml" -f "$m/node-guard.yaml" >/dev/null
  token="$("$BIN/kubectl" "${k[@]}" -n kaccel-system create token kaccel --duration 48h)"
  server="$("$BIN/kubectl" "${k[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$("$BIN/kubectl" "${k[@]}" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  (
    umask 077
    cat >"$RUN/kaccel.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: ${server}
    certificate-authority-data: ${ca}
users:
- name: system:serviceaccount:kaccel-system:kaccel
  user:
    token: ${token}
contexts:
- name: kaccel
  context:
    cluster: cluster
    user: system:serviceaccount:kaccel-system:kaccel
current-context: kaccel
EOF
  )
  log "kaccel's identity: ServiceAccount kaccel-system/kaccel with manifests/ RBAC; kubeconfig $RUN/kaccel.kubeconfig"
}

# `restart NAME`: SIGKILL one component (etcd, kube-apiserver or kueue) and start
# it again with the command line it was started with, keeping its data (etcd's
# data dir, Kueue's config), then wait until it serves again. The e2e fault tests
# call this while kaccel runs; it prints the seconds the component was down.
cmd_restart() {
  local name=${1:?usage: restart etcd|kube-apiserver|kueue} t0
  t0=$(date +%s.%N)
  cmd_kill "$name"
  cmd_start "$name"
  echo "$(date +%s.%N) $t0" | awk '{printf "%.3f\n", $1 - $2}'
}

# `kill NAME`: SIGKILL one component and leave it down (a worker cluster lost
# for a while); `start NAME` brings it back with its recorded command line.
cmd_kill() {
  local name=${1:?usage: kill etcd|kube-apiserver|kueue} pid
  [[ -f "$RUN/$name.cmd" ]] || die "no command line recorded for $name in $RUN (started by an older cluster.sh?)"
  if pid="$(pid_of "$name")"; then
    kill -KILL "$pid" 2>/dev/null || true
    while [[ -d "/proc/$pid" ]]; do sleep 0.05; done
  fi
  rm -f "$RUN/$name.pid"
}

cmd_start() {
  local name=${1:?usage: start etcd|kube-apiserver|kueue} cmd
  [[ -f "$RUN/$name.cmd" ]] || die "no command line recorded for $name in $RUN (started by an older cluster.sh?)"
  BIN="$(cat "$RUN/bin-dir")"
  pid_of "$name" >/dev/null && die "$name already runs"
  cmd="$(cat "$RUN/$name.cmd")"
  eval "start $name $cmd"
  case "$name" in
  etcd) wait_for "etcd serves again" etcd \
    bash -c "curl -fsS --max-time 2 http://127.0.0.1:${ETCD_PORT}/health | grep -q '\"health\":\"true\"'" ;;
  kube-apiserver) wait_for "kube-apiserver serves again" kube-apiserver curl_api /readyz ;;
  kueue) wait_for "kueue serves again" kueue curl -fsS --max-time 2 "http://127.0.0.1:${HEALTH_PORT}/readyz" ;;
  *) die "start: $name is not one of etcd, kube-apiserver, kueue" ;;
  esac
}

# `identity`: the same for a cluster this script did not start (KUBECONFIG).
cmd_identity() {
  BIN="$(bin_dir)"
  mkdir -p "$RUN"
  controller_identity "${KUBECONFIG:?KUBECONFIG: the admin kubeconfig of the cluster}"
}

cmd_env() {
  echo "export KUBECONFIG='$KUBECONFIG_FILE'"
  [[ -f "$RUN/kaccel.kubeconfig" ]] && echo "export KACCEL_E2E_CONTROLLER_KUBECONFIG='$RUN/kaccel.kubeconfig'"
  [[ -f "$RUN/bin-dir" ]] && echo "export PATH='$(cat "$RUN/bin-dir")':\"\$PATH\""
  return 0
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
identity) cmd_identity ;;
restart) cmd_restart "${2:-}" ;;
kill) cmd_kill "${2:-}" ;;
start) cmd_start "${2:-}" ;;
*)
  echo "usage: $0 up|down|status|env|identity|restart NAME|kill NAME|start NAME" >&2
  exit 2
  ;;
esac
