#!/usr/bin/env bash
# Builds sandboxd and the static guest init into $SANDBOXD_CACHE/bin and prints that folder,
# stamped with the git revision.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
bin="$SANDBOXD_CACHE/bin"
mkdir -p "$bin"
log "building sandboxd, sandbox-init and sandbox-spawn"
# The revision they report (`sandboxd version`, /readyz, sandboxd_build_info); -dirty when the
# tree has changes.
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || rev="$rev-dirty"
ldflags="-X sandboxd/internal/version.revision=$rev"
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/sandbox-init" ./cmd/sandbox-init
go build -ldflags "$ldflags" -o "$bin/sandboxd" ./cmd/sandboxd
# The spawner program beside the init: sandboxd finds it there (--spawner-binary).
scripts/build-guest-c.sh spawner "$bin/sandbox-spawn"
printf '%s\n' "$bin"
