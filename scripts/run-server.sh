#!/usr/bin/env bash
# Starts sandboxd on its embedded defaults: 127.0.0.1:8780, its own redis-server (Debian's
# package, supervised by sandboxd under the state folder), the local gVisor
# runtime and a local checkpoint folder. The first run installs what it needs (Debian packages,
# the pinned runsc, the base rootfs): a few minutes, once per machine. Extra arguments go to
# sandboxd (see `sandboxd -h`).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
need_root
apt_install redis-server debootstrap ca-certificates zstd e2fsprogs gcc libc6-dev
runsc=$(scripts/ensure-runsc.sh)
rootfs=$(scripts/ensure-rootfs.sh sandboxes-default)
scripts/build-dashboard.sh # only when internal/dashboard/web changed since dist/ was built
bin=$(scripts/build.sh)

if [ -z "${SANDBOX_API_KEY:-}" ]; then
	keyfile="$SANDBOXD_CACHE/dev-api-key"
	[ -s "$keyfile" ] || (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$keyfile")
	SANDBOX_API_KEY=$(cat "$keyfile")
	log "development API key (tenant dev, project default): export SANDBOX_API_KEY=\$(cat $keyfile)"
fi
export SANDBOX_API_KEY
log "starting sandboxd; try: curl -sS -H \"X-Api-Key: \$SANDBOX_API_KEY\" http://127.0.0.1:8780/sandbox/sandboxes/v1"
exec "$bin/sandboxd" --runsc "$runsc" --init-binary "$bin/sandbox-init" --rootfs "$rootfs" "$@"
