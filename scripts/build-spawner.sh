#!/usr/bin/env bash
# Builds the spawner program (guest/spawner/spawner.c), static, into OUT: the process the guest
# init starts every command with (see guest/server/spawner.go). Installs gcc when missing.
# usage: build-spawner.sh OUT
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || die "usage: scripts/build-spawner.sh OUT"
out=$1
apt_install gcc libc6-dev # libc6-dev: the static libc
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
gcc -std=c11 -O2 -static -Wall -Wextra -Werror -o "$tmp" guest/spawner/spawner.c
mv -f "$tmp" "$out"
