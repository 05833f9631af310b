#!/usr/bin/env bash
# Build the e2e control plane once, from Go modules, into a cache outside the
# work tree:
#
#   ${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}/bin-<hash>/
#       etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kueue
#       kueue-crds/*.yaml                    (Kueue's CRDs, from the module)
#       kueue-webhooks.yaml                  (Kueue's webhook manifests)
#       VERSIONS                             (what was built, and how)
#
# <hash> covers the version lines of e2e/versions.env and the recipe below, so
# a version bump builds into a fresh folder and an unchanged one is reused.
# Prints the folder path as the last line of stdout.
set -euo pipefail

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$E2E_DIR/versions.env"
# One run against another Kueue release (e2e/kueue-versions.sh): it builds into
# its own bin-<hash>/ folder, since the hash covers the effective version.
KUEUE_VERSION="${KACCEL_E2E_KUEUE_VERSION:-$KUEUE_VERSION}"

RECIPE=5 # bump when the build steps below change in a way that matters
CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
HASH="$( {
  grep -E '^(KUBERNETES|ETCD)_' "$E2E_DIR/versions.env"
  echo "KUEUE_VERSION=$KUEUE_VERSION"
  echo "recipe=$RECIPE"
} | sha256sum | cut -c1-12)"
OUT="$CACHE/bin-$HASH"
WORK="$CACHE/work-$HASH"

T0=$(date +%s)
log() { printf '[build %s +%4ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed (need Go >= 1.25 to build Kubernetes ${KUBERNETES_VERSION})"

if [[ -f "$OUT/.complete" ]]; then
  log "cache hit: $OUT"
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT" "$WORK"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
LDS='-s -w'
touch "$OUT/VERSIONS.tmp"
note() { echo "$*" >>"$OUT/VERSIONS.tmp"; }
note "go: $(go version)"

timed() { # timed <name> <cmd...>: run a build step, log its duration
  local name=$1 t
  shift
  t=$(date +%s)
  log "building $name ..."
  "$@"
  log "built $name in $(($(date +%s) - t))s"
  note "build-seconds $name: $(($(date +%s) - t))"
}

# ---------------------------------------------------------------- etcd
build_etcd_go() {
  local d="$WORK/etcd"
  mkdir -p "$d"
  cat >"$d/go.mod" <<EOF
module kaccel.local/e2e/etcd

go 1.25
EOF
  # etcd's own main.go (module go.etcd.io/etcd/v3) only calls etcdmain.Main;
  # that module uses local replace directives, so we call the server module directly.
  cat >"$d/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$d" && go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" && go mod tidy &&
    go build -ldflags="$LDS" -o "$OUT/etcd" .)
}

build_etcd() {
  if timed etcd build_etcd_go; then
    note "etcd: go.etcd.io/etcd/server/v3@${ETCD_VERSION} (Go build)"
    return
  fi
  log "!!!!! Go build of etcd FAILED - falling back to Debian's etcd-server package !!!!!"
  if ! command -v etcd >/dev/null; then
    command -v apt-get >/dev/null || die "no apt-get for the etcd fallback"
    DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server >&2 || die "apt-get install etcd-server failed"
  fi
  cp "$(command -v etcd)" "$OUT/etcd"
  note "etcd: DEBIAN FALLBACK $("$OUT/etcd" --version | head -1)"
}

# ---------------------------------------------- kube-apiserver + kubectl
build_k8s_go() {
  local d="$WORK/k8s" modfile staging
  mkdir -p "$d"
  go mod download -x=false "k8s.io/kubernetes@${KUBERNETES_VERSION}" >&2
  modfile="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$modfile" ]] || die "no go.mod for k8s.io/kubernetes@${KUBERNETES_VERSION}"
  # Every staging module k8s.io/kubernetes replaces with ./staging/src/... is
  # published on its own as v0.<minor>.<patch>: replace it with that release.
  staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$modfile")"
  [[ -n "$staging" ]] || die "found no staging replaces in $modfile"
  {
    echo "module kaccel.local/e2e/k8s"
    echo
    echo "go $(sed -n 's/^go \(.*\)/\1/p' "$modfile")"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m ${KUBERNETES_STAGING_VERSION}"; done
    echo ")"
  } >"$d/go.mod"
  : >"$d/go.sum"
  local major minor
  major="${KUBERNETES_VERSION#v}" && major="${major%%.*}"
  minor="${KUBERNETES_VERSION#v*.}" && minor="${minor%%.*}"
  local ld="$LDS" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=${KUBERNETES_VERSION} -X $p.gitMajor=${major} -X $p.gitMinor=${minor}"
    ld+=" -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$d" && go get "k8s.io/kubernetes/cmd/kube-apiserver@${KUBERNETES_VERSION}" "k8s.io/kubernetes/cmd/kubectl@${KUBERNETES_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@${KUBERNETES_VERSION}" "k8s.io/kubernetes/cmd/kube-scheduler@${KUBERNETES_VERSION}") >&2
  timed kube-apiserver bash -c "cd '$d' && go build -ldflags='$ld' -o '$OUT/kube-apiserver' k8s.io/kubernetes/cmd/kube-apiserver"
  timed kubectl bash -c "cd '$d' && go build -ldflags='$ld' -o '$OUT/kubectl' k8s.io/kubernetes/cmd/kubectl"
  # Only its Job and ServiceAccount controllers run (e2e/cluster.sh): Jobs create pods.
  timed kube-controller-manager bash -c "cd '$d' && go build -ldflags='$ld' -o '$OUT/kube-controller-manager' k8s.io/kubernetes/cmd/kube-controller-manager"
  # One profile, for the pods that name it (e2e/cluster.sh): the real DRA allocator.
  timed kube-scheduler bash -c "cd '$d' && go build -ldflags='$ld' -o '$OUT/kube-scheduler' k8s.io/kubernetes/cmd/kube-scheduler"
  note "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: k8s.io/kubernetes@${KUBERNETES_VERSION}, staging @${KUBERNETES_STAGING_VERSION}"
}

# ---------------------------------------------------------------- kueue
build_kueue() {
  local d="$WORK/kueue" src
  mkdir -p "$d"
  # sigs.k8s.io/kueue (v0.16 and v0.17) has no replace directives, so go install works.
  timed kueue env GOBIN="$d" go install -ldflags="$LDS -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" \
    "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}"
  mv "$d/kueue" "$OUT/kueue"
  src="$(go env GOMODCACHE)/sigs.k8s.io/kueue@${KUEUE_VERSION}"
  rm -rf "$OUT/kueue-crds"
  mkdir -p "$OUT/kueue-crds"
  cp "$src"/config/components/crd/bases/*.yaml "$OUT/kueue-crds/"
  cp "$src/config/components/webhook/manifests.yaml" "$OUT/kueue-webhooks.yaml"
  chmod -R u+w "$OUT/kueue-crds" "$OUT/kueue-webhooks.yaml"
  local crds=("$OUT"/kueue-crds/*.yaml)
  note "kueue: sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION} (+ ${#crds[@]} CRDs)"
}

log "building into $OUT (work dir $WORK)"
[[ -x "$OUT/etcd" ]] || build_etcd
[[ -x "$OUT/kube-apiserver" && -x "$OUT/kubectl" && -x "$OUT/kube-controller-manager" && -x "$OUT/kube-scheduler" ]] || build_k8s_go || die "Kubernetes ${KUBERNETES_VERSION} build failed"
[[ -x "$OUT/kueue" && -d "$OUT/kueue-crds" ]] || build_kueue || die "Kueue ${KUEUE_VERSION} build failed"

"$OUT/kube-apiserver" --version >&2
"$OUT/kubectl" version --client >&2
"$OUT/etcd" --version | sed -n 1p >&2 # sed reads it all: head would SIGPIPE etcd under pipefail
cat "$OUT/VERSIONS.tmp" >>"$OUT/VERSIONS"
rm -f "$OUT/VERSIONS.tmp"
touch "$OUT/.complete"
log "done: $OUT"
echo "$OUT"
