#!/usr/bin/env bash
# Installs what Tessera's real nodes (make demo, the real-node tests) need:
# runc (containerd 2 comes from hack/tools.sh), the CNI plugins, iptables for kube-proxy and a static
# busybox for the demo image; and Debian's prometheus package (prometheus for
# the demo, promtool for the alerting-rule tests). Debian/Ubuntu packages; needs root. Does nothing
# when all are present.
set -euo pipefail

missing=()
# Debian's prometheus package: the demo runs prometheus, the tests promtool.
{ command -v promtool && command -v prometheus; } >/dev/null || missing+=(prometheus)
if [[ -n "${TESSERA_SKIP_REAL_NODES:-}" ]]; then
  echo "hack/node-deps.sh: TESSERA_SKIP_REAL_NODES is set; not checking real-node packages" >&2
else
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  [[ -x /bin/busybox ]] || missing+=(busybox-static)
  command -v nsenter >/dev/null || missing+=(util-linux)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
fi
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) != 0 ]]; then
  echo "hack/node-deps.sh: real nodes need root and these packages: ${missing[*]}" >&2
  echo "  install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
command -v apt-get >/dev/null || { echo "hack/node-deps.sh: no apt-get; install ${missing[*]} by hand" >&2; exit 1; }
echo "hack/node-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
