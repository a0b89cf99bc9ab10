# Shared helpers for the setup scripts. Sourced, never run.
# Everything is cached under SANDBOXD_CACHE (default ~/.cache/sandboxd) and built once per machine.

SANDBOXD_CACHE="${SANDBOXD_CACHE:-$HOME/.cache/sandboxd}"
# The runsc we build and pin (Debian's runsc release 20221219 breaks bookworm tools: statx).
RUNSC_VERSION="v0.0.0-20260905035102-160fafc42237"

log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
	[ "$(id -u)" = 0 ] || die "this needs root (runsc, debootstrap and apt-get do): run it with sudo"
}

# apt_install PKG... installs the Debian packages that are missing, running apt-get update once.
apt_install() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing Debian packages: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
}

# debian_mirror prints the Debian archive this machine's apt already uses.
debian_mirror() {
	local m=""
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		m=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
	fi
	if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
		m=$(awk '/^deb / && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
	fi
	[ -n "$m" ] || die "cannot find the Debian mirror in /etc/apt: set DEBIAN_MIRROR"
	printf '%s\n' "${DEBIAN_MIRROR:-$m}"
}
