#!/usr/bin/env bash
# Install the agent as a systemd service on a Linux VM, from this source tree (or --package SPEC):
#   - a system user and group `coordinator` (no login, no home of its own);
#   - a virtualenv in /opt/coordinator holding the package (`coordinator` is /opt/coordinator/bin/coordinator);
#   - /etc/coordinator/coordinator.yaml, copied from deploy/coordinator.example.yaml only if absent;
#   - /etc/systemd/system/coordinator.service, enabled when systemd runs (it is started only once the
#     configuration is no longer the fresh example: edit it first).
# Safe to run again: each step says what it found and does only what is missing or changed.
#
#   sudo deploy/systemd/install.sh [--dry-run] [--root DIR] [--package SPEC] [--python PYTHON] [--reinstall]
#
# --dry-run       print what would be done, change nothing
# --root DIR      install under DIR (an image being built, a test): no user is created and systemd is
#                 only told to enable the unit inside DIR (systemctl --root)
# --package SPEC  what pip installs (a wheel, a path, name==version); default: this source tree
# --python P      the Python (3.11 or newer) the virtualenv is made from; default: python3
# --reinstall     install the package even if the same version is already there
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=/
DRY_RUN=0
PACKAGE=""
PYTHON=python3
REINSTALL=0
USER_NAME=coordinator
VENV=/opt/coordinator
CONFIG_DIR=/etc/coordinator
CONFIG=$CONFIG_DIR/coordinator.yaml
STATE_DIR=/var/lib/coordinator
UNIT_NAME=coordinator.service
UNIT=/etc/systemd/system/$UNIT_NAME

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
say() { echo "install: $*"; }
die() { echo "install: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --root) [ $# -ge 2 ] || die "--root needs a directory"; ROOT=$2; shift ;;
        --root=*) ROOT=${1#--root=} ;;
        --package) [ $# -ge 2 ] || die "--package needs a pip requirement"; PACKAGE=$2; shift ;;
        --package=*) PACKAGE=${1#--package=} ;;
        --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PYTHON=$2; shift ;;
        --python=*) PYTHON=${1#--python=} ;;
        --reinstall) REINSTALL=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done

[ -d "$ROOT" ] || die "--root $ROOT: no such directory"
ROOT=$(cd "$ROOT" && pwd)
# $R prefixes every path written: empty for the running system.
if [ "$ROOT" = / ]; then R=""; else R=$ROOT; fi

# Run a command, or only print it with --dry-run.
run() {
    if [ "$DRY_RUN" -eq 1 ]; then
        say "would run: $*"
    else
        say "running: $*"
        "$@"
    fi
}

if [ "$DRY_RUN" -eq 0 ] && [ -z "$R" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (or with sudo), or try --dry-run"
fi
if [ ! -f "$SRC/pyproject.toml" ] || [ ! -f "$SRC/deploy/coordinator.example.yaml" ]; then
    die "$SRC does not look like the source tree (pyproject.toml, deploy/coordinator.example.yaml)"
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "$PYTHON: Python 3.11 or newer is required (--python PATH)"

# 1. The user the service runs as (User= in the unit).
have_user=0
if [ -n "$R" ]; then
    say "not creating user $USER_NAME under $ROOT: create it on the target system" \
        "(useradd --system --user-group --home-dir $STATE_DIR --no-create-home --shell /usr/sbin/nologin $USER_NAME)"
elif getent passwd "$USER_NAME" >/dev/null; then
    say "user $USER_NAME exists"
    have_user=1
else
    run useradd --system --user-group --home-dir "$STATE_DIR" --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
    have_user=1
fi

# 2. The virtualenv and the package.
if [ -x "$R$VENV/bin/python" ]; then
    say "virtualenv $VENV exists"
else
    run install -d -m 0755 "$R$VENV"
    run "$PYTHON" -m venv "$R$VENV"
fi
package_changed=0
source_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$SRC/pyproject.toml")
installed_version=""
if [ -x "$R$VENV/bin/coordinator" ]; then
    installed_version=$("$R$VENV/bin/coordinator" --version 2>/dev/null | sed -n 's/^coordinator //p' || true)
fi
if [ -z "$PACKAGE" ] && [ "$REINSTALL" -eq 0 ] && [ -n "$installed_version" ] \
    && [ "$installed_version" = "$source_version" ]; then
    say "coordinator $installed_version is installed in $VENV (--reinstall to install it again)"
else
    run "$R$VENV/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet --upgrade "${PACKAGE:-$SRC}"
    package_changed=1
fi

# 3. The configuration: never overwritten. It may hold webhook tokens: readable by root and the service.
config_fresh=0
if [ -e "$R$CONFIG" ]; then
    say "configuration $CONFIG kept as it is"
else
    run install -d -m 0755 "$R$CONFIG_DIR"
    if [ "$have_user" -eq 1 ]; then
        run install -m 0640 -o root -g "$USER_NAME" "$SRC/deploy/coordinator.example.yaml" "$R$CONFIG"
    else
        run install -m 0644 "$SRC/deploy/coordinator.example.yaml" "$R$CONFIG"
    fi
    config_fresh=1
fi
if [ "$have_user" -eq 1 ] && [ ! -d "$R$STATE_DIR" ]; then
    # systemd creates it too (StateDirectory=); this is for `coordinator run` by hand as the user.
    run install -d -m 0750 -o "$USER_NAME" -g "$USER_NAME" "$R$STATE_DIR"
fi

# 4. The unit.
unit_changed=0
if cmp -s "$SRC/deploy/systemd/$UNIT_NAME" "$R$UNIT"; then
    say "unit $UNIT is up to date"
else
    run install -D -m 0644 "$SRC/deploy/systemd/$UNIT_NAME" "$R$UNIT"
    unit_changed=1
fi

# 5. Enable (and start) it where systemd can.
if [ -n "$R" ]; then
    if command -v systemctl >/dev/null; then
        run systemctl --root="$ROOT" enable "$UNIT_NAME"
    else
        say "systemctl not found: $UNIT_NAME is installed under $ROOT but not enabled"
    fi
elif [ -d /run/systemd/system ]; then
    [ "$unit_changed" -eq 0 ] || run systemctl daemon-reload
    run systemctl enable "$UNIT_NAME"
    if [ "$config_fresh" -eq 1 ]; then
        say "edit $CONFIG (cluster, zookeeper.hosts, actions), check it with" \
            "'$VENV/bin/coordinator check-config --config $CONFIG', then: systemctl start $UNIT_NAME"
    elif [ "$unit_changed" -eq 1 ] || [ "$package_changed" -eq 1 ]; then
        # A restart with a configuration the new version rejects would leave the VM without its agent.
        if [ "$DRY_RUN" -eq 0 ] && ! "$VENV/bin/coordinator" check-config --config "$CONFIG" >/dev/null; then
            die "$CONFIG is rejected by the installed version (above): not restarting $UNIT_NAME"
        fi
        run systemctl restart "$UNIT_NAME"
    else
        run systemctl start "$UNIT_NAME"
    fi
else
    say "systemd is not running here (no /run/systemd/system): $UNIT_NAME is installed but not enabled;" \
        "once systemd runs: systemctl enable --now $UNIT_NAME"
fi
if [ "$DRY_RUN" -eq 1 ]; then say "done (dry run: nothing was changed)"; else say "done"; fi
