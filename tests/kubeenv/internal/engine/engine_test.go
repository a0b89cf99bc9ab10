package engine

import (
	"flag"
	"slices"
	"testing"

	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// TestShimArgs checks that a shim rebuilds the node's engine from its ShimArgs.
func TestShimArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		eng  Engine
	}{
		{"runsc", NewRunsc(&runsc.CLI{Path: "/bin/runsc", Root: "/run/r", Flags: []string{"--platform=systrap", "--network=none"}})},
		{"runc", NewRunc(&runc.CLI{Path: "/usr/sbin/runc", Root: "/d/runc-root", CgroupParent: "/kubeenv-0123"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Flags
			fs := flag.NewFlagSet("shim", flag.ContinueOnError)
			f.Register(fs)
			if err := fs.Parse(tc.eng.ShimArgs()); err != nil {
				t.Fatal(err)
			}
			got, err := f.Engine()
			if err != nil {
				t.Fatal(err)
			}
			if got.Handler() != tc.eng.Handler() || !slices.Equal(got.ShimArgs(), tc.eng.ShimArgs()) {
				t.Fatalf("got %s %v, want %s %v", got.Handler(), got.ShimArgs(), tc.eng.Handler(), tc.eng.ShimArgs())
			}
		})
	}
}

func TestFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no-root", []string{"--runtime=/bin/runsc"}},
		{"runc-no-parent", []string{"--handler=runc", "--runtime=/usr/sbin/runc", "--root=/r"}},
		{"unknown-handler", []string{"--handler=kata", "--runtime=/bin/kata", "--root=/r"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Flags
			fs := flag.NewFlagSet("shim", flag.ContinueOnError)
			f.Register(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if e, err := f.Engine(); err == nil {
				t.Fatalf("got engine %s, want an error", e.Handler())
			}
		})
	}
}
