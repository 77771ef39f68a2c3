#!/usr/bin/env bash
# Builds the Kubernetes, etcd, helm, kwok, containerd, Kueue and Jaeger binaries Tessera's tests
# run, from the Go modules pinned in e2e/tools/*/go.mod (Jaeger: its own module, below), into a
# cache outside the work tree.
#
#   hack/tools.sh          build what is missing for the tests, print the bin directory
#   hack/tools.sh demo     build only what `make demo` runs (etcd, Kubernetes, helm, containerd, Jaeger)
#   hack/tools.sh --path   print the bin directory only (no build)
#
# The oldest Kubernetes the docs claim (docs/install.md) is built beside them,
# into <bin>/oldest, from e2e/tools/k8s-oldest: the install smoke test
# (e2e/tests/oldest_kubernetes.rs) runs on it. Kueue's controller manager and
# its CRDs go into <bin>/kueue, from e2e/tools/kueue (e2e/tests/real_nodes.rs).
# Jaeger (the demo's trace store, e2e/tests/traces.rs) goes into <bin>/jaeger,
# built inside its own module at $JAEGER_MODULE_VERSION: its go.mod has replace
# directives, which Go ignores in a dependency, so it cannot be pinned from a
# go.mod of ours like the others; the module's checksum is still verified.
#
# A build goes into a temporary directory and is moved into place whole, with a
# stamp written last, so a half-finished build never counts as cached.
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.14
HELM_VERSION=v3.21.4
KWOK_VERSION=v0.8.0
CONTAINERD_VERSION=v2.4.2
OLDEST_K8S_VERSION=v1.30.14
KUEUE_VERSION=v0.17.0
# The Go module v1.76.0 is Jaeger v2.13.0 (the v2 binary lives in the v1 module path).
JAEGER_MODULE_VERSION=v1.76.0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
# The key changes whenever the pinned modules change, so an edit to
# e2e/tools/*/go.{mod,sum} (a new version, a new binary) rebuilds. The oldest
# Kubernetes has a key of its own, so adding or moving it rebuilds only it.
pinned=()
for kind in mod sum; do
  for tool in containerd etcd helm k8s kwok; do pinned+=("$root/e2e/tools/$tool/go.$kind"); done
done
key=$(cat "${pinned[@]}" | sha256sum | cut -c1-12)
bin="$cache/tools/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION-kwok-$KWOK_VERSION-containerd-$CONTAINERD_VERSION-$key/bin"
oldest_stamp="$OLDEST_K8S_VERSION-$(cat "$root"/e2e/tools/k8s-oldest/go.mod "$root"/e2e/tools/k8s-oldest/go.sum | sha256sum | cut -c1-12)"
kueue_stamp="$KUEUE_VERSION-$(cat "$root"/e2e/tools/kueue/go.mod "$root"/e2e/tools/kueue/go.sum | sha256sum | cut -c1-12)"
oldest_built() { [[ "$(cat "$bin/oldest/.complete" 2>/dev/null)" == "$oldest_stamp" ]]; }
kueue_built() { [[ "$(cat "$bin/kueue/.complete" 2>/dev/null)" == "$kueue_stamp" ]]; }
jaeger_built() { [[ "$(cat "$bin/jaeger/.complete" 2>/dev/null)" == "$JAEGER_MODULE_VERSION" ]]; }
# kwok is moved into place whole (a rename), so its presence is its stamp;
# its version and module are in the bin directory's name.
kwok_built() { [[ -x "$bin/kwok" ]]; }

case "${1:-}" in
  --path) echo "$bin"; exit 0 ;;
  demo) only_demo=1 ;;
  "") only_demo= ;;
  *) echo "hack/tools.sh: unknown argument ${1}; use --path, demo or nothing" >&2; exit 2 ;;
esac
if [[ -f "$bin/.complete" ]] && jaeger_built && { [[ -n "$only_demo" ]] || { kwok_built && oldest_built && kueue_built; }; }; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "hack/tools.sh: no Go toolchain on PATH; install Go >= 1.26" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
mkdir -p "$cache/tools"

# Link-time version stamps for Kubernetes binaries of version $1.
k8s_ldflags() {
  local version=$1 minor kv flags="-s -w"
  minor=$(echo "$version" | cut -d. -f2)
  for kv in gitVersion=$version gitMajor=1 gitMinor=$minor gitTreeState=clean \
    gitCommit=0000000000000000000000000000000000000000 buildDate=2026-07-15T00:00:00Z; do
    flags="$flags -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  echo "$flags"
}

# The oldest Kubernetes: the server and node binaries (kubectl and helm are
# the current ones), into $bin/oldest, stamped last.
build_oldest() {
  local otmp start=$SECONDS
  otmp=$(mktemp -d "$bin/.oldest.XXXXXX")
  echo "hack/tools.sh: building Kubernetes $OLDEST_K8S_VERSION, the oldest claimed (cold: about 8 minutes on 2 cores)" >&2
  (cd "$root/e2e/tools/k8s-oldest" && go build -p "$(nproc)" -tags selinux,notest,grpcnotrace \
    -ldflags "$(k8s_ldflags "$OLDEST_K8S_VERSION")" -o "$otmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy) || { rm -rf "$otmp"; return 1; }
  "$otmp/kube-apiserver" --version >&2
  chmod 755 "$otmp"
  rm -rf "$bin/oldest"
  mv "$otmp" "$bin/oldest"
  echo "$oldest_stamp" >"$bin/oldest/.complete"
  echo "hack/tools.sh: built Kubernetes $OLDEST_K8S_VERSION in $((SECONDS - start)) s" >&2
}

# kwok (simulated nodes for the scale bench) reports its version from a link-time stamp.
build_kwok() {
  local start=$SECONDS
  echo "hack/tools.sh: building kwok $KWOK_VERSION" >&2
  (cd "$root/e2e/tools/kwok" && go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    -o "$bin/.kwok.tmp" sigs.k8s.io/kwok/cmd/kwok) || { rm -f "$bin/.kwok.tmp"; return 1; }
  "$bin/.kwok.tmp" --version >&2
  mv "$bin/.kwok.tmp" "$bin/kwok"
  echo "hack/tools.sh: built kwok $KWOK_VERSION in $((SECONDS - start)) s" >&2
}

# Kueue's controller manager, and its CRDs from the same module version, into
# $bin/kueue, stamped last.
build_kueue() {
  local ktmp start=$SECONDS crds
  ktmp=$(mktemp -d "$bin/.kueue.XXXXXX")
  echo "hack/tools.sh: building Kueue $KUEUE_VERSION (cold: about 4 minutes on 2 cores)" >&2
  (cd "$root/e2e/tools/kueue" && go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    -o "$ktmp/kueue" sigs.k8s.io/kueue/cmd/kueue) || { rm -rf "$ktmp"; return 1; }
  crds=$(cd "$root/e2e/tools/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)/config/components/crd/bases
  mkdir "$ktmp/crds"
  cp "$crds"/*.yaml "$ktmp/crds/"
  chmod -R u+w,a+rX "$ktmp"
  rm -rf "$bin/kueue"
  mv "$ktmp" "$bin/kueue"
  echo "$kueue_stamp" >"$bin/kueue/.complete"
  echo "hack/tools.sh: built Kueue $KUEUE_VERSION in $((SECONDS - start)) s" >&2
}

# Jaeger v2 (OTLP receiver, in-memory store, query API) into $bin/jaeger,
# stamped last.
build_jaeger() {
  local jtmp start=$SECONDS dir
  jtmp=$(mktemp -d "$bin/.jaeger.XXXXXX")
  echo "hack/tools.sh: building Jaeger (module $JAEGER_MODULE_VERSION; cold: about 6 minutes on 2 cores)" >&2
  dir=$(go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_MODULE_VERSION" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') || { rm -rf "$jtmp"; return 1; }
  (cd "$dir" && go build -ldflags "-s -w" -o "$jtmp/jaeger" ./cmd/jaeger) || { rm -rf "$jtmp"; return 1; }
  chmod 755 "$jtmp"
  rm -rf "$bin/jaeger"
  mv "$jtmp" "$bin/jaeger"
  echo "$JAEGER_MODULE_VERSION" >"$bin/jaeger/.complete"
  echo "hack/tools.sh: built Jaeger in $((SECONDS - start)) s" >&2
}

# What the tests need beyond the demo's tools.
build_test_tools() {
  kwok_built || build_kwok
  oldest_built || build_oldest
  kueue_built || build_kueue
}

if [[ -f "$bin/.complete" ]]; then
  jaeger_built || build_jaeger
  [[ -n "$only_demo" ]] || build_test_tools
  echo "$bin"
  exit 0
fi

ldf=$(k8s_ldflags "$K8S_VERSION")
minor=$(echo "$K8S_VERSION" | cut -d. -f2)

tmp=$(mktemp -d "$cache/tools/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

echo "hack/tools.sh: building etcd $ETCD_VERSION" >&2
(cd "$root/e2e/tools/etcd" && go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)

echo "hack/tools.sh: building Kubernetes $K8S_VERSION (cold: about 10 minutes on 2 cores)" >&2
(cd "$root/e2e/tools/k8s" && go build -p "$(nproc)" -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)

# helm v3 reports Kubernetes v1.20 as the cluster version of `helm template` and
# `helm lint` unless told otherwise at link time (its Makefile derives it).
echo "hack/tools.sh: building helm $HELM_VERSION" >&2
hldf="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/chartutil pkg/lint/rules; do
  hldf="$hldf -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
done
(cd "$root/e2e/tools/helm" && go build -ldflags "$hldf" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm)

# containerd 2 and its runc shim for the real nodes (CDI on by default), and
# ctr to import images into them.
echo "hack/tools.sh: building containerd $CONTAINERD_VERSION" >&2
(cd "$root/e2e/tools/containerd" && go build -tags no_btrfs,no_devmapper,no_zfs \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" -o "$tmp/" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)

"$tmp/kube-apiserver" --version >&2
"$tmp/containerd" --version >&2
"$tmp/etcd" --version | sed -n 1p >&2 # sed reads to the end: head would close the pipe early and pipefail fail the build (SIGPIPE, 141)
"$tmp/helm" version --short >&2
chmod 755 "$tmp"
rm -rf "$bin"
mkdir -p "$(dirname "$bin")"
mv "$tmp" "$bin"
trap - EXIT
date -u +%FT%TZ >"$bin/.complete"
echo "hack/tools.sh: built in $((SECONDS - start)) s" >&2
build_jaeger
[[ -n "$only_demo" ]] || build_test_tools
echo "$bin"
