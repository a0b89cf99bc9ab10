// Package version says which sandboxd this is: the release version (the VERSION file beside
// this code, embedded at build time; one command, scripts/set-version.sh, bumps it together with
// the image tags in deploy/base/kustomization.yaml, which a test holds equal to it), the source
// revision it was built from and the Go release that built it. sandboxd, sandbox-init and the
// image builder all report it. Standard library only, so the guest init can link it.
package version

import (
	_ "embed"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

//go:embed VERSION
var file string

// Version is the release version (the VERSION file, e.g. "0.1.0").
var Version = strings.TrimSpace(file)

// revision is the source revision, set by the image builder and scripts with
// -ldflags "-X sandboxd/internal/version.revision=<git commit>" (its builds run with
// -buildvcs=false, so that the same source gives the same bytes in any checkout).
var revision string

// Revision is the source revision the binary was built from: the one set at link time, else
// the version control information the go command stamped (with "-dirty" when the tree had
// changes), else "unknown".
func Revision() string {
	if revision != "" {
		return revision
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "unknown"
	}
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// GoVersion is the Go release that built the binary ("go1.26.8").
func GoVersion() string { return runtime.Version() }

// String is the one-line report of program's version, as `sandboxd version` prints it:
// "sandboxd 0.1.0 (revision 95bdad3…, go1.26.8 linux/amd64)".
func String(program string) string {
	return fmt.Sprintf("%s %s (revision %s, %s %s/%s)", program, Version, Revision(), GoVersion(), runtime.GOOS, runtime.GOARCH)
}
