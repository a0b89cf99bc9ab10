#!/usr/bin/env bash
# Builds the read-only base rootfs of a profile with debootstrap, once per machine, and prints its path.
# usage: ensure-rootfs.sh [PROFILE]   (default: sandboxes-default)
# The rootfs is rebuilt only when the package list below or the build steps change (the hash of
# the list and the steps' version, vN in the key, names the folder: bump it with every step changed).
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

key=$(printf '%s|%s|v4' "$profile" "$packages" | sha256sum | cut -c1-12)
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
# A login shell (`bash -lc CMD`, how agents run commands) without the two processes Debian's
# profiles start on the way: /etc/profile's `$(id -u)` (bash knows its EUID) and root's
# ~/.profile's `mesg n` (only meaningful on a terminal). Each is a fork and exec, about as
# much as the command itself inside gVisor. Same behaviour; a file that differs is left as is.
# rewrite_lines FILE PATTERN REPLACEMENT: sed's s#PATTERN#REPLACEMENT# (a BRE) on FILE, or a
# note that no line matches (the file is then left as is).
rewrite_lines() {
	if grep -q "$2" "$1"; then
		sed -i "s#$2#$3#" "$1"
	else
		log "note: no line of ${1#"$tmp"} matches $2; left as is"
	fi
}
rewrite_lines "$tmp/etc/profile" '^\( *\)if \[ "$(id -u)" -eq 0 \]; then$' '\1if [ "${EUID:-$(id -u)}" -eq 0 ]; then'
rewrite_lines "$tmp/root/.profile" '^mesg n 2> /dev/null || true$' 'if [ -t 0 ]; then mesg n 2> /dev/null || true; fi'
# Mount points the sandbox needs even though the root is read-only.
mkdir -p "$tmp/workspace" "$tmp/.sbx" "$tmp/run/sbx"
chmod 0755 "$tmp/workspace"
touch "$tmp/.sbx-complete"
rm -f "$tmp.log"
rm -rf "$dir"
mv "$tmp" "$dir"
log "rootfs built in $(($(date +%s) - start)) s: $dir ($(du -sh "$dir" | cut -f1))"
printf '%s\n' "$dir"
