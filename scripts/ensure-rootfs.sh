#!/usr/bin/env bash
# Builds the read-only base rootfs of a profile with debootstrap, once per machine, and prints its path.
# usage: ensure-rootfs.sh [PROFILE]   (default: sandboxes-default)
# The rootfs is rebuilt only when the package list below changes (its hash names the folder).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_root

profile="${1:-sandboxes-default}"
case "$profile" in
sandboxes-default)
	# bash, coreutils, git, curl, python3 and pytest, so `bash -lc "python -m pytest -q"` runs.
	packages="bash,coreutils,git,curl,ca-certificates,python3,python-is-python3,python3-pytest,procps,less,xz-utils,zstd,unzip"
	;;
*) die "unknown profile $profile" ;;
esac

key=$(printf '%s|%s|v3' "$profile" "$packages" | sha256sum | cut -c1-12)
dir="$SANDBOXD_CACHE/rootfs/$profile-$key"
if [ -f "$dir/.sbx-complete" ]; then
	printf '%s\n' "$dir"
	exit 0
fi

command -v debootstrap >/dev/null || apt_install debootstrap
mirror=$(debian_mirror)
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$(dirname "$dir")"
log "building the $profile rootfs with debootstrap (once per machine, about 2-3 min): $packages"
start=$(date +%s)
debootstrap --variant=minbase --include="$packages" bookworm "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
	tail -20 "$tmp.log" >&2
	die "debootstrap failed (log: $tmp.log)"
}
# Trim what a sandbox never needs: apt lists and caches, locales, docs.
rm -rf "$tmp"/var/cache/apt/* "$tmp"/var/lib/apt/lists/* "$tmp"/usr/share/locale/* "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/*
# The default LANG=C.UTF-8 from one locale-archive: without it glibc opens the locale's category
# files one by one at every setlocale, about 5 ms of each command's start inside gVisor.
chroot "$tmp" localedef --add-to-archive /usr/lib/locale/C.utf8 >>"$tmp.log" 2>&1 || {
	tail -20 "$tmp.log" >&2
	die "localedef --add-to-archive failed (log: $tmp.log)"
}
# Mount points the sandbox needs even though the root is read-only.
mkdir -p "$tmp/workspace" "$tmp/.sbx" "$tmp/run/sbx"
chmod 0755 "$tmp/workspace"
touch "$tmp/.sbx-complete"
rm -f "$tmp.log"
rm -rf "$dir"
mv "$tmp" "$dir"
log "rootfs built in $(($(date +%s) - start)) s: $dir ($(du -sh "$dir" | cut -f1))"
printf '%s\n' "$dir"
