#!/usr/bin/env bash
# Builds the local Kubernetes test cluster's programs once per source state and prints their folder:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes, pinned by
# tests/kubeenv/go.mod) and tests/kubeenv's own etcd, vknode and kubeenv, in ONE `go build` (they
# share most packages). The folder is keyed by a hash of tests/kubeenv's go.mod, go.sum, all its .go
# files and `go version`; an unchanged tree costs nothing. Cold: ~10 min and ~3 GB of memory on 2 cores.
# Also installs Debian's runc when missing: the node runs the pods of RuntimeClass "runc" (handler
# runc, which `kubeenv up` creates) natively with it.
# usage: ensure-kubeenv.sh      (then: "$dir/kubeenv" up --dir ... --bin "$dir" ...)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

[ -x /usr/sbin/runc ] || command -v runc >/dev/null || apt_install runc

K8S_VERSION="v1.37.2"
programs="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl vknode kubeenv"

root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/tests/kubeenv"
[ -f "$mod/go.mod" ] || die "missing $mod/go.mod"
command -v go >/dev/null || die "go is not installed"

key=$(
	cd "$mod"
	{
		go version
		cat go.mod go.sum
		find . -name '*.go' -type f | LC_ALL=C sort | xargs -r sha256sum
	} | sha256sum | cut -c1-16
)
dir="$SANDBOXD_CACHE/kubeenv/$key"

complete() {
	[ -f "$dir/.complete" ] || return 1
	for p in $programs; do [ -x "$dir/$p" ] || return 1; done
}
if complete; then
	printf '%s\n' "$dir"
	exit 0
fi

mkdir -p "$SANDBOXD_CACHE/kubeenv"
# One build at a time per machine (a second caller waits, then finds the folder complete).
exec 9>"$SANDBOXD_CACHE/kubeenv/.lock"
if command -v flock >/dev/null; then
	flock 9
	if complete; then
		printf '%s\n' "$dir"
		exit 0
	fi
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
log "building the test cluster's programs ($programs) into $dir (cold ~10 min on 2 cores, then cached)"
start=$(date +%s)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
(
	cd "$mod"
	go build -o "$tmp/" -ldflags "$ldflags" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl \
		./cmd/etcd ./cmd/vknode ./cmd/kubeenv
) >&2 || die "building the test cluster's programs failed"
for p in $programs; do [ -x "$tmp/$p" ] || die "the build did not produce $p"; done
touch "$tmp/.complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "built in $(($(date +%s) - start)) s: $dir ($(du -sh "$dir" | cut -f1))"
# Keep the three newest builds (~400 MB each); older ones are only taking space.
ls -1dt "$SANDBOXD_CACHE"/kubeenv/*/ 2>/dev/null | grep -E '/[0-9a-f]{16}/$' | tail -n +4 | xargs -r rm -rf
printf '%s\n' "$dir"
