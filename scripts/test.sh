#!/usr/bin/env bash
# Install everything the tests need (Debian packages, npm tools, the package with its test
# extras, the sysctl the kernel tests rely on), then run the whole suite.  Root on Debian;
# idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(
  nftables iproute2 systemd util-linux gcc            # kernel fence tests, unit file checks
  prometheus prometheus-alertmanager                 # real Prometheus, promtool, Alertmanager
  mtail inotify-tools                                # peers the benchmarks beat
  docker-registry openssl                            # real registry, TLS test certificates
  mediawiki php-cli php-sqlite3 php-mbstring php-xml php-intl
  chromium                                           # headless browser for the status page
)
missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node may come from a build that bundles npm (Debian's npm package would conflict with it).
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The kernel tests run nftables in network namespaces of their own; netfilter logs from
# namespaces other than the initial one only when this is set.
sysctl -q -w net.netfilter.nf_log_all_netns=1

# verdaccio (the npm registry the registry tests publish to): 6.10 needs Node 22; on Node 20,
# 6.8.0 with node-fetch pinned to 2.7.0.
tools="${CAPALARM_TEST_TOOLS:-/opt/capalarm-test}/verdaccio"
if [[ "$("$tools/node_modules/.bin/verdaccio" --version 2>/dev/null)" != "v6.8.0" ]]; then
  mkdir -p "$tools"
  cat >"$tools/package.json" <<'JSON'
{"name": "capalarm-test-verdaccio", "private": true,
 "dependencies": {"verdaccio": "6.8.0"},
 "overrides": {"node-fetch": "2.7.0"}}
JSON
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error)
fi

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[test]'
python3 -m pytest -q "$@"
