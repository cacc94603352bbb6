#!/bin/sh
# Install mcplhost as a systemd service on a stock Debian or Ubuntu machine.
# Run as root from a clone (deploy/README.md explains every step):
#
#   sudo deploy/install.sh                          # from this clone
#   sudo deploy/install.sh --wheel mcplhost-0.1.0-py3-none-any.whl
#   deploy/install.sh --print-unit                  # the unit it would install (no root needed)
#
# What it does, in order:
#   1. a system user and group (mcplhost) whose home is the state directory;
#   2. a venv at /opt/mcplhost with mcplhost installed into it (no system pip,
#      so no "externally-managed-environment"); /opt/mcplhost/bin/mcplhost
#      runs the bundled connectors too (`mcplhost connector NAME`);
#   3. /etc/mcplhost owned by root with the service's group (0750), the config
#      in it readable by that group (0640); an existing config is kept;
#   4. /var/lib/mcplhost for the database (systemd's StateDirectory= makes it
#      too; it is made here so a first check works before systemd runs), and
#      /etc/mcplhost/env, one env file per connector (the service user's, 0700;
#      each file 0600), with an empty one for the example's heartbeat;
#   5. the unit in /etc/systemd/system, then `systemctl daemon-reload`; its
#      StateDirectory=, WorkingDirectory= and ReadWritePaths= follow
#      MCPLHOST_STATE_DIR, as the config's store.path does;
#   6. check-config run AS the service user, so a config the service could
#      not read fails here and not at the first start.
# It does not start the service: edit the config first, then
#   systemctl enable --now mcplhost
#
# Every location is an environment variable (tests install into a temporary
# folder with a throwaway user):
#   MCPLHOST_USER=mcplhost              user and group of the service
#   MCPLHOST_PREFIX=/opt/mcplhost       the venv
#   MCPLHOST_CONFIG_DIR=/etc/mcplhost
#   MCPLHOST_STATE_DIR=/var/lib/mcplhost
#   MCPLHOST_UNIT_DIR=/etc/systemd/system
#   MCPLHOST_PYTHON=/usr/bin/python3    the interpreter the venv is made from (3.11 or newer;
#                                       the system one, not one under a private home such as pyenv's)
#   MCPLHOST_SYSTEMCTL=auto             auto: daemon-reload when systemd runs; no: never
set -eu

here=$(cd "$(dirname "$0")" && pwd)
user=${MCPLHOST_USER:-mcplhost}
prefix=${MCPLHOST_PREFIX:-/opt/mcplhost}
config_dir=${MCPLHOST_CONFIG_DIR:-/etc/mcplhost}
state_dir=${MCPLHOST_STATE_DIR:-/var/lib/mcplhost}
unit_dir=${MCPLHOST_UNIT_DIR:-/etc/systemd/system}
python=${MCPLHOST_PYTHON:-/usr/bin/python3}
systemctl_mode=${MCPLHOST_SYSTEMCTL:-auto}
source=$(dirname "$here")

print_unit=no

say() { printf 'install.sh: %s\n' "$*"; }

# The unit with this install's locations written in. The state directory is named once
# (MCPLHOST_STATE_DIR) and every line that needs it follows: StateDirectory= can only name
# a folder under /var/lib, so elsewhere it is left out and step 4's folder is the one used.
render_unit() {
    case $state_dir in
        /var/lib/?*) state_name=${state_dir#/var/lib/}; no_state_directory='' ;;
        *) state_name=mcplhost; no_state_directory='/^StateDirectory/d' ;;
    esac
    sed -e "$no_state_directory" -e "s|^StateDirectory=mcplhost\$|StateDirectory=$state_name|" \
        -e "s|/opt/mcplhost/|$prefix/|g" -e "s|/etc/mcplhost/|$config_dir/|g" \
        -e "s|/var/lib/mcplhost|$state_dir|g" \
        -e "s|^User=mcplhost\$|User=$user|" -e "s|^Group=mcplhost\$|Group=${group:-$user}|" \
        "$here/mcplhost.service"
}
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --wheel) [ $# -ge 2 ] || die "--wheel needs a file"; source=$2; shift 2 ;;
        --source) [ $# -ge 2 ] || die "--source needs a folder"; source=$2; shift 2 ;;
        -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --print-unit) print_unit=yes; shift ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

if [ "$print_unit" = yes ]; then render_unit; exit 0; fi   # what step 5 would install, for review and tests

[ "$(id -u)" -eq 0 ] || die "run as root (it creates a user and writes under /opt and /etc)"
[ -e "$source" ] || die "$source: no such wheel or folder"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die "$python: mcplhost needs Python 3.11 or newer"
"$python" -m venv --help >/dev/null 2>&1 && "$python" -c 'import ensurepip' 2>/dev/null \
    || die "$python cannot make a venv: apt-get install python3-venv"

# 1. The service's user and group.
if ! id -u "$user" >/dev/null 2>&1; then
    say "creating system user $user"
    useradd --system --user-group --home-dir "$state_dir" --no-create-home \
        --shell /usr/sbin/nologin --comment "mcplhost daemon" "$user"
fi
group=$(id -gn "$user")

# 2. The venv, owned by root and readable by everyone: the service runs it, never writes it.
say "installing $source into $prefix"
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
"$prefix/bin/python" -m pip install --quiet --upgrade "$source"
chmod -R go+rX,go-w "$prefix"
runuser -u "$user" -- "$prefix/bin/python" -c pass 2>/dev/null \
    || die "user $user cannot run $prefix/bin/python: is $python under a private folder (e.g. /root)? set MCPLHOST_PYTHON"

# 3. The config: root owns it, the service's group may read it.
install -d -m 0750 -o root -g "$group" "$config_dir"
if [ -e "$config_dir/mcplhost.toml" ]; then
    say "keeping the existing $config_dir/mcplhost.toml"
else
    sed -e "s#/opt/mcplhost/#$prefix/#g" -e "s#/var/lib/mcplhost/#$state_dir/#g" \
        -e "s#/etc/mcplhost/#$config_dir/#g" \
        "$here/mcplhost.example.toml" > "$config_dir/mcplhost.toml.new"
    chown root:"$group" "$config_dir/mcplhost.toml.new"
    chmod 0640 "$config_dir/mcplhost.toml.new"
    mv "$config_dir/mcplhost.toml.new" "$config_dir/mcplhost.toml"
    say "wrote $config_dir/mcplhost.toml (edit it; each connector's tokens go in $config_dir/env/NAME.env, mode 0600)"
fi

# 4. The state directory (StateDirectory= in the unit makes and owns it under systemd, when under /var/lib),
#    and the connectors' env files: readable by the service user alone, which mcplhost insists on.
install -d -m 0750 -o "$user" -g "$group" "$state_dir"
install -d -m 0700 -o "$user" -g "$group" "$config_dir/env"
if [ ! -e "$config_dir/env/heartbeat.env" ]; then
    printf '# NAME=VALUE lines for the heartbeat connector alone (docs/operations.md#connector-environments-and-secrets).\n' \
        > "$config_dir/env/heartbeat.env"
    chown "$user:$group" "$config_dir/env/heartbeat.env"
    chmod 0600 "$config_dir/env/heartbeat.env"
fi

# 5. The unit, with this install's locations written in.
install -d -m 0755 "$unit_dir"
render_unit > "$unit_dir/mcplhost.service"
chmod 0644 "$unit_dir/mcplhost.service"
if [ "$systemctl_mode" != no ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi

# 6. The check, as the service will see it.
runuser -u "$user" -- "$prefix/bin/mcplhost" check-config "$config_dir/mcplhost.toml" \
    || die "the config does not pass check-config as user $user (above); fix it before starting"

say "done. Next: edit $config_dir/mcplhost.toml, then: systemctl enable --now mcplhost"
