#!/usr/bin/env bash
# Runs the whole test suite: formatting, vet, generated-code freshness, and `go test -race` of
# every package, including the end-to-end tests in tests/ against the built sandboxd with real
# runsc. Tests that need Redis start their own real redis-server (internal/redistest) and stop
# it by PID, so FLUSHALL in one test never disturbs another.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
need_root
# python3: the benchmark's floor script is tested on the host (cmd/sandbox-bench/floor_test.go).
apt_install redis-server debootstrap ca-certificates zstd git e2fsprogs iproute2 chromium fonts-dejavu-core python3 gcc libc6-dev
# The dashboard's browser test (tests/dashboard_test.go) drives Debian's Chromium with chromedp.
export SANDBOXD_CHROMIUM; SANDBOXD_CHROMIUM=$(command -v chromium)

export SANDBOXD_RUNSC; SANDBOXD_RUNSC=$(scripts/ensure-runsc.sh)
export SANDBOXD_ROOTFS; SANDBOXD_ROOTFS=$(scripts/ensure-rootfs.sh sandboxes-default)
# graphql-http's GraphQL-over-HTTP server audits, run by tests/graphql_http_audit_test.go (the
# script installs Node.js and npm from Debian only when the machine has none).
export SANDBOXD_GRAPHQL_HTTP; SANDBOXD_GRAPHQL_HTTP=$(scripts/ensure-graphql-http.sh)
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
log "the dashboard's committed build is what its sources build to"
scripts/build-dashboard.sh --force
stale=$(git status --porcelain -- internal/dashboard)
[ -z "$stale" ] || die "scripts/build-dashboard.sh changed files (commit the rebuilt dist/): $stale"

# The Kubernetes test cluster (tests/kubeenv: kube-apiserver, etcd, controllers, scheduler and a
# virtual-kubelet node whose pods are runsc containers) for the kube runtime's tests: built once
# (cold ~10 min, then cached), started on loopback, stopped by its PID when the tests end.
kube_bin=$(scripts/ensure-kubeenv.sh)
log "tests/kubeenv (its own module): vet, and its smoke test of a cluster of its own"
(cd tests/kubeenv && go vet ./... && KUBEENV_BIN="$kube_bin" go test -count=1 -timeout 10m ./...)
kube_dir=$(mktemp -d /tmp/sandboxd-kubeenv.XXXXXX)
# The node runs the images deploy/ ships: scripts/build-images.sh's OCI layouts of the guest init
# and the default sandbox base, which the node unpacks as a kubelet would pull them.
scripts/build-images.sh "$kube_dir/images" >&2
log "starting the Kubernetes test cluster in $kube_dir"
"$kube_bin/kubeenv" up --dir "$kube_dir/cluster" --bin "$kube_bin" --runsc "$SANDBOXD_RUNSC" \
	--oci-layout "$kube_dir/images/sandbox-init" --oci-layout "$kube_dir/images/sandbox-default" \
	>"$kube_dir/kubeenv.log" 2>&1 &
kube_pid=$!
stop_cluster() {
	kill -TERM "$kube_pid" 2>/dev/null || true
	wait "$kube_pid" 2>/dev/null || true
	rm -rf "$kube_dir"
}
trap stop_cluster EXIT
for _ in $(seq 1 240); do
	[ -f "$kube_dir/cluster/ready" ] && break
	kill -0 "$kube_pid" 2>/dev/null || { cat "$kube_dir/kubeenv.log" >&2; die "the Kubernetes test cluster did not start"; }
	sleep 0.5
done
[ -f "$kube_dir/cluster/ready" ] || { cat "$kube_dir/kubeenv.log" >&2; die "the Kubernetes test cluster was not ready in 120 s"; }
export SANDBOXD_KUBEENV="$kube_dir/cluster" SANDBOXD_KUBECTL="$kube_bin/kubectl"

# The end-to-end package (tests/) takes about 30 minutes alone, more than all the others
# together. go test builds and runs packages in the order they are named (two at a time on
# two cores): named first, it starts at once and the others run beside it, where listed in
# import path order it started last, after all the others (the stage took their time plus its).
log "go test -race ./..."
others=$(go list ./... | grep -vx sandboxd/tests) # an assignment, so that a failed list stops the run
# shellcheck disable=SC2086 # one package per word
go test -race -count=1 -timeout 60m sandboxd/tests $others "$@"

# The allocation tests again, without the race detector: its sync.Pool drops a quarter of what
# is put back, so some of them skip under it.
log "go test -run AllocatesLittle ./guest/server"
go test -count=1 -run AllocatesLittle ./guest/server "$@"

# The native fuzz targets, each mutating for a short fixed number of inputs (go test -fuzz takes
# one target per run; their seed corpora, f.Add and testdata/fuzz/, already ran above as plain
# tests), about 8 s each on 2 cores. A count, not a time: Go 1.26's fuzzing coordinator can fail
# a run whose -fuzztime ends while a worker is busy ("context deadline exceeded" with no failing
# input, golang/go#75804, fixed in Go 1.27). SANDBOXD_FUZZTIME (a time or a count) replaces
# every target's. New interesting inputs stay in GOCACHE's fuzz cache; a failing input is written
# to the package's testdata/fuzz/<Target>/ (commit it, with the fix, as a regression seed).
# Minimizing each new input is capped, or it would take the whole time of a run.
for target in \
	"./internal/rest FuzzRESTDecode 5000x" \
	"./resolvers FuzzGraphQLInputs 8000x" \
	"./internal/tarsafe FuzzCleanName 300000x" \
	"./internal/source FuzzArchive 6000x" \
	"./guest/server FuzzImportTar 12000x" \
	"./guest/server FuzzResolvePath 60000x"; do
	read -r pkg name fuzz_time <<<"$target"
	fuzz_time="${SANDBOXD_FUZZTIME:-$fuzz_time}"
	log "fuzz $name in $pkg for $fuzz_time"
	go test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzz_time" -fuzzminimizetime 100x "$pkg"
done
