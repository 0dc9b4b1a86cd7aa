#!/usr/bin/env bash
# Install everything the tests need (Debian packages, npm tools, the package with its test
# extras, the sysctl the kernel tests rely on), then run the whole suite.  Root on Debian;
# idempotent.  Arguments go to pytest.
#
# The package goes into the interpreter `python3` names: in an activated virtual environment,
# that environment's.  Debian 12's own python3 refuses pip installs outside one (PEP 668):
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/test.sh
#
# Another apt or dpkg holding the package lock (unattended upgrades on a freshly booted
# machine) is waited for, up to CAPALARM_APT_WAIT seconds (default 600), not a failure.
set -euo pipefail

APT_WAIT="${CAPALARM_APT_WAIT:-600}"
APT_POLL="${CAPALARM_APT_POLL:-5}"  # seconds between tries while the lists lock is held

DEBS=(
  nftables iproute2 systemd util-linux gcc            # kernel fence tests, unit file checks
  prometheus prometheus-alertmanager                 # real Prometheus, promtool, Alertmanager
  mtail inotify-tools                                # peers the benchmarks beat
  docker-registry openssl                            # real registry, TLS test certificates
  mediawiki php-cli php-sqlite3 php-mbstring php-xml php-intl
  chromium                                           # headless browser for the status page
)

say() { printf 'test.sh: %s\n' "$*" >&2; }

# apt-get "$@", waiting for another apt/dpkg that holds a lock instead of failing at once.
# DPkg::Lock::Timeout makes apt itself wait for the dpkg lock; `apt-get update`'s lock on the
# package lists is not covered by it, so a failure to lock is also retried until the deadline.
# The first try does not wait, so that a held lock is said before the wait starts.
apt_get() {
  local deadline=$((SECONDS + APT_WAIT)) timeout=0 said="" err rc holder
  err="$(mktemp)"
  while :; do
    rc=0
    apt-get -o "DPkg::Lock::Timeout=$timeout" "$@" 2>"$err" || rc=$?
    if ((rc == 0)); then
      cat "$err" >&2
      rm -f "$err"
      return 0
    fi
    # A held lock is said and waited for at least once: SECONDS counts whole seconds, so
    # a short deadline can pass during the first try (then nothing said why it failed).
    if grep -qE 'Could not get lock|Unable to lock|Unable to acquire' "$err" \
      && { ((SECONDS < deadline)) || [[ -z "$said" ]]; }; then
      if [[ -z "$said" ]]; then
        holder="$(grep -m1 -oE 'held by process [0-9]+( \([^)]*\))?' "$err" || true)"
        say "another apt/dpkg holds the package lock${holder:+ ($holder)}; waiting up to ${APT_WAIT}s for it to finish"
        said=1
      fi
      timeout=$((deadline > SECONDS ? deadline - SECONDS : 0))
      sleep "$APT_POLL"
      continue
    fi
    if [[ -n "$said" ]] && grep -qE 'Could not get lock|Unable to lock|Unable to acquire' "$err"; then
      say "gave up after ${APT_WAIT}s: the package lock is still held (CAPALARM_APT_WAIT to wait longer)"
    fi
    cat "$err" >&2
    rm -f "$err"
    return "$rc"
  done
}

# Refuse early, with the fix, where pip would refuse later with a page of text: an
# interpreter marked EXTERNALLY-MANAGED (PEP 668) outside a virtual environment.
require_installable_python() {
  if python3 - <<'PY'; then
import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(marker) else 1)
PY
    say "$(command -v python3) is the system's Python, which refuses pip installs outside a virtual environment (PEP 668)."
    say "Make one first:  apt-get install python3-venv && python3 -m venv .venv && . .venv/bin/activate"
    say "then run this again (in that shell: bash scripts/test.sh)."
    return 1
  fi
}

install_debs() {
  local missing=() p
  for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  # Node may come from a build that bundles npm (Debian's npm package would conflict with it).
  command -v npm >/dev/null || missing+=(nodejs npm)
  ((${#missing[@]})) || return 0
  export DEBIAN_FRONTEND=noninteractive
  say "updating the package lists (apt-get update)"
  apt_get update -qq
  say "installing ${#missing[@]} Debian packages (a few minutes on a fresh machine): ${missing[*]}"
  apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# verdaccio (the npm registry the registry tests publish to): 6.10 needs Node 22; on Node 20,
# 6.8.0 with node-fetch pinned to 2.7.0.
install_verdaccio() {
  local tools="${CAPALARM_TEST_TOOLS:-/opt/capalarm-test}/verdaccio"
  [[ "$("$tools/node_modules/.bin/verdaccio" --version 2>/dev/null)" != "v6.8.0" ]] || return 0
  say "installing verdaccio 6.8.0 (npm registry for the registry tests) into $tools"
  mkdir -p "$tools"
  cat >"$tools/package.json" <<'JSON'
{"name": "capalarm-test-verdaccio", "private": true,
 "dependencies": {"verdaccio": "6.8.0"},
 "overrides": {"node-fetch": "2.7.0"}}
JSON
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error)
}

install_package() {
  say "installing capalarm and its test extras (pip, editable) into $(python3 -c 'import sys; print(sys.prefix)')"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e '.[test]'
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  require_installable_python
  install_debs
  # The kernel tests run nftables in network namespaces of their own; netfilter logs from
  # namespaces other than the initial one only when this is set.
  sysctl -q -w net.netfilter.nf_log_all_netns=1
  install_verdaccio
  install_package
  say "running the tests (python3 -m pytest $*)"
  python3 -m pytest -q "$@"
}

# Sourced (by tests/test_test_script.py), it only defines the functions.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
