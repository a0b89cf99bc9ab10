#!/usr/bin/env bash
# Runs the whole test suite: formatting, vet, generated-code freshness, and `go test -race` of
# every package, including the end-to-end tests in tests/ against the built sandboxd with real
# runsc. Tests that need Redis start their own real redis-server (internal/redistest) and stop
# it by PID, so FLUSHALL in one test never disturbs another.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
need_root
apt_install redis-server debootstrap ca-certificates zstd git

export SANDBOXD_RUNSC; SANDBOXD_RUNSC=$(scripts/ensure-runsc.sh)
export SANDBOXD_ROOTFS; SANDBOXD_ROOTFS=$(scripts/ensure-rootfs.sh sandboxes-default)
log "go mod download"
go mod download

log "gofmt"
unformatted=$(git ls-files -co --exclude-standard '*.go' | grep -v '^graph/' | xargs -r gofmt -l)
[ -z "$unformatted" ] || die "gofmt would change: $unformatted"
log "go vet"
go vet ./...
log "go generate is up to date"
go generate ./...
stale=$(git status --porcelain -- graph resolvers schema.graphqls gqlgen.yml)
[ -z "$stale" ] || die "go generate changed files (commit the regenerated code): $stale"

log "go test -race ./..."
go test -race -count=1 -timeout 40m ./... "$@"
