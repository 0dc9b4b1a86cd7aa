#!/usr/bin/env bash
# Install everything the tests need (Debian packages, the package with its test extras, the
# sysctl the kernel tests rely on), then run the whole suite.  Root on Debian; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(nftables iproute2 prometheus prometheus-alertmanager mtail inotify-tools gcc systemd util-linux)
missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The kernel tests run nftables in network namespaces of their own; netfilter logs from
# namespaces other than the initial one only when this is set.
sysctl -q -w net.netfilter.nf_log_all_netns=1

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[test]'
python3 -m pytest -q "$@"
