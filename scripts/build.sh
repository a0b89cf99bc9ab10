#!/usr/bin/env bash
# Builds sandboxd and the static guest init into $SANDBOXD_CACHE/bin and prints that folder.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
bin="$SANDBOXD_CACHE/bin"
mkdir -p "$bin"
log "building sandboxd and sandbox-init"
CGO_ENABLED=0 go build -trimpath -o "$bin/sandbox-init" ./cmd/sandbox-init
go build -o "$bin/sandboxd" ./cmd/sandboxd
printf '%s\n' "$bin"
