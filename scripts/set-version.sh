#!/usr/bin/env bash
# Sets the release version: internal/version/VERSION (what sandboxd and sandbox-init report and
# the images' tag) and the tags of the project's images in deploy/base/kustomization.yaml, which
# tests/kube_test.go holds to the same value.
# usage: scripts/set-version.sh 0.2.0
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
v="${1:-}"
[[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "usage: scripts/set-version.sh MAJOR.MINOR.PATCH[-PRERELEASE]"
printf '%s\n' "$v" >internal/version/VERSION
# Each images: entry of sandboxd/* in the base: the newTag line after its name line.
awk -v v="$v" '
	/^  - name: sandboxd\// { ours = 1; print; next }
	/^  - name: / { ours = 0 }
	ours && /^    newTag:/ { print "    newTag: \"" v "\""; next }
	{ print }
' deploy/base/kustomization.yaml >deploy/base/kustomization.yaml.tmp
mv deploy/base/kustomization.yaml.tmp deploy/base/kustomization.yaml
log "version $v: internal/version/VERSION and deploy/base/kustomization.yaml"
