#!/usr/bin/env bash
# Builds every image deploy/ runs, without Docker, as OCI image layouts in OUTDIR (one folder per
# image, its index.json naming it by reference, and OUTDIR/images.json with digests and sizes):
#   sandboxd/sandboxd:VERSION         the gateway (static, from scratch, runs as 65532)
#   sandboxd/sandbox-init:VERSION     the static guest init at /sandbox-init (kube.init_image), the
#                                     spawner program at /sandbox-spawn
#   sandboxd/sandbox-default:VERSION  the default sandbox base: the debootstrap rootfs of
#                                     scripts/ensure-rootfs.sh, the guest init at /.sbx/init, the
#                                     spawner program at /.sbx/spawn
# VERSION is internal/version/VERSION. With --push REGISTRY it also pushes REGISTRY/sandboxd:VERSION,
# REGISTRY/sandbox-init:VERSION and REGISTRY/sandbox-default:VERSION (credentials: the docker
# config, ~/.docker/config.json, and its credential helpers).
# Reproducible: every time in the images is SOURCE_DATE_EPOCH, else the commit's time; the same
# tree and rootfs give the same digests. Compressed layers are cached in $SANDBOXD_CACHE/images.
# usage: build-images.sh OUTDIR [--push REGISTRY] [build-images flags: --tag, --revision, --source, --epoch]
# SANDBOXD_ROOTFS names the rootfs; without it scripts/ensure-rootfs.sh builds it (as root).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || die "usage: scripts/build-images.sh OUTDIR [--push REGISTRY] [--tag TAG]"
out=$1
shift
rootfs="${SANDBOXD_ROOTFS:-}"
[ -n "$rootfs" ] || rootfs=$(scripts/ensure-rootfs.sh sandboxes-default)
bin="$SANDBOXD_CACHE/bin"
mkdir -p "$bin"
go build -o "$bin/build-images" ./cmd/build-images
log "building the images into $out (rootfs $rootfs)"
"$bin/build-images" --out "$out" --rootfs "$rootfs" --cache "$SANDBOXD_CACHE/images" "$@"
