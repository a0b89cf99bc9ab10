#!/usr/bin/env bash
# Builds the web dashboard and the GraphiQL page (internal/dashboard/web: TypeScript, preact,
# xterm.js, GraphiQL) into internal/dashboard/dist, which the sandboxd binary embeds. The built
# files are committed, so a plain `go build ./...` needs no Node.js; run this after changing
# anything under internal/dashboard/web, and commit dist/ with it (internal/dashboard's
# TestDistFresh fails while dist/ is older than the sources). The npm packages are the ones
# package-lock.json pins, installed once per lock file under $SANDBOXD_CACHE/dashboard; Node.js
# and npm come from Debian's packages when the machine has none.
#
#   scripts/build-dashboard.sh           build when dist/ is older than the sources
#   scripts/build-dashboard.sh --force   build anyway (scripts/test.sh: the build must
#                                        reproduce the committed dist/ byte for byte)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
repo=$(pwd)
web="$repo/internal/dashboard/web"
dist="$repo/internal/dashboard/dist"

# source_hash is build.mjs's hash of the sources: sha256 over "path\0size\0bytes" of each
# source file, in byte order of their paths (internal/dashboard's TestDistFresh: the same).
source_hash() {
	(
		cd "$web"
		{ printf '%s\n' build.mjs package.json package-lock.json tsconfig.json; find src -type f; } | LC_ALL=C sort |
			while IFS= read -r f; do
				printf '%s\0%s\0' "$f" "$(stat -c %s "$f")"
				cat "$f"
			done | sha256sum | cut -d' ' -f1
	)
}
if [ "${1:-}" != "--force" ] && [ -f "$dist/source.sha256" ] && [ "$(cat "$dist/source.sha256")" = "$(source_hash)" ]; then
	log "the dashboard's build is up to date"
	exit 0
fi

node_ok() {
	command -v node >/dev/null 2>&1 &&
		[ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 20 ]
}
if ! node_ok || ! command -v npm >/dev/null 2>&1; then
	need_root
	apt_install nodejs npm
fi
node_ok || die "node $(node --version 2>/dev/null || echo missing) is older than 20 (the build uses import.meta.dirname)"

lock_hash=$(sha256sum "$web/package-lock.json" | cut -c1-16)
deps="$SANDBOXD_CACHE/dashboard/deps-$lock_hash"
if [ ! -f "$deps/.complete" ]; then
	log "npm ci of the dashboard's packages into $deps"
	rm -rf "$deps"
	mkdir -p "$deps"
	cp "$web/package.json" "$web/package-lock.json" "$deps/"
	# No install scripts: esbuild's binary comes in its platform package.
	(cd "$deps" && npm ci --no-audit --no-fund --ignore-scripts >&2) || die "npm ci of the dashboard's packages failed"
	touch "$deps/.complete"
fi

# The build runs in a copy of the sources beside the installed packages, so that no
# node_modules folder is ever in the tree.
work="$SANDBOXD_CACHE/dashboard/work"
rm -rf "$work"
mkdir -p "$work"
cp -r "$web/src" "$web/build.mjs" "$web/package.json" "$web/package-lock.json" "$web/tsconfig.json" "$work/"
ln -s "$deps/node_modules" "$work/node_modules"
log "type-checking the dashboard"
(cd "$work" && node_modules/.bin/tsc -p .) || die "the dashboard's TypeScript does not type-check"
log "building the dashboard into internal/dashboard/dist"
(cd "$work" && node build.mjs --out "$dist" >&2) || die "the dashboard's build failed"
