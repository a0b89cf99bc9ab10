#!/usr/bin/env bash
# Installs the pinned graphql-http (the GraphQL-over-HTTP spec's server audits, run by
# scripts/graphql-audit.mjs) and its graphql peer dependency with npm, once per machine, and
# prints the folder that holds their node_modules. Node.js and npm come from Debian's packages
# when the machine has none.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

GRAPHQL_HTTP_VERSION="1.23.1"
GRAPHQL_VERSION="16.15.0"

# Node 18 is the first with a global fetch, which the audits use.
node_ok() {
	command -v node >/dev/null 2>&1 &&
		[ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 18 ]
}
if ! node_ok; then
	need_root
	apt_install nodejs
fi
if ! command -v npm >/dev/null 2>&1; then
	need_root
	apt_install npm
fi
node_ok || die "node $(node --version 2>/dev/null || echo missing) is older than 18: the audits need its fetch"

dir="$SANDBOXD_CACHE/graphql-http/$GRAPHQL_HTTP_VERSION-graphql-$GRAPHQL_VERSION"
installed() {
	[ -f "$dir/.complete" ] &&
		(cd "$dir" && node -e 'require("graphql-http"); require("graphql")' >/dev/null 2>&1)
}
if installed; then
	printf '%s\n' "$dir"
	exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
log "npm install graphql-http@$GRAPHQL_HTTP_VERSION graphql@$GRAPHQL_VERSION into $dir"
printf '{"name":"sandboxd-graphql-http","private":true}\n' >"$dir/package.json"
# No lock file, and none of the registry's addresses in npm's hidden one: the folder is a cache.
(cd "$dir" && npm install --no-audit --no-fund --no-package-lock --omit-lockfile-registry-resolved \
	--save-exact "graphql-http@$GRAPHQL_HTTP_VERSION" "graphql@$GRAPHQL_VERSION" >&2) ||
	die "npm install of graphql-http failed"
(cd "$dir" && node -e 'require("graphql-http"); require("graphql")') || die "the installed graphql-http does not load"
touch "$dir/.complete"
printf '%s\n' "$dir"
