#!/usr/bin/env bash
# Builds one of the guest's C programs, static, into OUT:
#   spawner  guest/spawner/spawner.c, the process the guest init starts every command with
#            (see guest/server/spawner.go)
#   connect  guest/connect/connect.c, the Kubernetes runtime's attach to the guest init (see
#            runtime/kube/attach.go)
# Installs gcc when missing.
# usage: build-guest-c.sh spawner|connect OUT
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
usage="usage: scripts/build-guest-c.sh spawner|connect OUT"
[ $# -eq 2 ] || die "$usage"
case $1 in
spawner | connect) src="guest/$1/$1.c" ;;
*) die "$usage" ;;
esac
out=$2
apt_install gcc libc6-dev # libc6-dev: the static libc
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
gcc -std=c11 -O2 -static -pthread -Wall -Wextra -Werror -o "$tmp" "$src"
mv -f "$tmp" "$out"
