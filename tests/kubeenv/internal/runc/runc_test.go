package runc

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"sandboxd/tests/kubeenv/internal/runsc"
)

func TestUnescapeMountPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/tmp/a", "/tmp/a"},
		{`/tmp/a\040b`, "/tmp/a b"},
		{`/tmp/a\011b\134c`, "/tmp/a\tb\\c"},
		{`/tmp/a\0`, `/tmp/a\0`},
	} {
		if got := unescapeMountPath(tc.in); got != tc.want {
			t.Errorf("unescapeMountPath(%q): got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCgroupParentFor(t *testing.T) {
	a, b := CgroupParentFor("/tmp/x/node"), CgroupParentFor("/tmp/x/node/")
	if a != b || !strings.HasPrefix(a, "/kubeenv-") || len(a) != len("/kubeenv-")+16 {
		t.Fatalf("CgroupParentFor: got %q and %q, want one /kubeenv-<16 hex digits>", a, b)
	}
	if c := CgroupParentFor("/tmp/y/node"); c == a {
		t.Fatalf("CgroupParentFor: two data dirs share %q", c)
	}
	cli := &CLI{CgroupParent: a}
	if got, want := cli.Cgroup("kv01"), a+"/kv01"; got != want {
		t.Fatalf("Cgroup: got %q, want %q", got, want)
	}
}

func TestComplete(t *testing.T) {
	var hard syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &hard); err != nil {
		t.Fatal(err)
	}
	common := func() []runsc.Mount {
		return []runsc.Mount{
			{Destination: "/proc", Type: "proc"},
			{Destination: "/dev", Type: "tmpfs"},
			{Destination: "/dev/pts", Type: "devpts"},
			{Destination: "/data", Type: "bind"},
		}
	}
	for _, tc := range []struct {
		name   string
		mounts []runsc.Mount
		want   []string
	}{
		{"mqueue-after-dev", common(), []string{"/proc", "/dev", "/dev/mqueue", "/dev/pts", "/data"}},
		{"volume-at-dev", []runsc.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "/dev", Type: "bind"}}, []string{"/proc", "/dev"}},
		{"volume-at-mqueue", append(common(), runsc.Mount{Destination: "/dev/mqueue", Type: "bind"}), []string{"/proc", "/dev", "/dev/pts", "/data", "/dev/mqueue"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &runsc.Spec{Mounts: tc.mounts}
			spec.Process.Rlimits = []runsc.Rlimit{{Type: "RLIMIT_NOFILE", Hard: hard.Max + 1000, Soft: hard.Max + 1000}, {Type: "RLIMIT_CORE", Hard: 7, Soft: 7}}
			cli := &CLI{CgroupParent: "/kubeenv-test"}
			cli.Complete(spec, "kv01")
			var got []string
			for _, m := range spec.Mounts {
				got = append(got, m.Destination)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("mounts: got %v, want %v", got, tc.want)
			}
			if spec.Linux.CgroupsPath != "/kubeenv-test/kv01" {
				t.Errorf("cgroupsPath: got %q, want /kubeenv-test/kv01", spec.Linux.CgroupsPath)
			}
			if !slices.Contains(spec.Linux.MaskedPaths, "/proc/keys") || !slices.Contains(spec.Linux.ReadonlyPaths, "/proc/sys") {
				t.Errorf("masked %v, read-only %v: want runc spec's defaults", spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths)
			}
			if d := spec.Linux.Resources.Devices; len(d) != 1 || d[0].Allow || d[0].Access != "rwm" {
				t.Errorf("device rules: got %+v, want deny rwm", d)
			}
			if rl := spec.Process.Rlimits[0]; rl.Hard != hard.Max || rl.Soft != hard.Max {
				t.Errorf("RLIMIT_NOFILE: got %+v, want clamped to the hard limit %d", rl, hard.Max)
			}
			if rl := spec.Process.Rlimits[1]; rl.Hard != 7 || rl.Soft != 7 {
				t.Errorf("RLIMIT_CORE: got %+v, want 7/7 untouched", rl)
			}
		})
	}
}
