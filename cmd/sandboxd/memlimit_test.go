package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// TestCgroupMemoryMax: the limit of the process's cgroup, v2 and v1, and none where the file
// says so or is missing; a hostile path in /proc/self/cgroup stays under the root.
func TestCgroupMemoryMax(t *testing.T) {
	write := func(t *testing.T, path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, proc string
		files      map[string]string
		want       int64
		ok         bool
	}{
		{"v2", "0::/kubepods/pod1/c1\n", map[string]string{"kubepods/pod1/c1/memory.max": "1073741824\n"}, 1 << 30, true},
		{"v2 namespace root", "0::/\n", map[string]string{"memory.max": "536870912\n"}, 512 << 20, true},
		{"v2 no limit", "0::/\n", map[string]string{"memory.max": "max\n"}, 0, false},
		{"v2 no file", "0::/a\n", nil, 0, false},
		{"v1", "12:cpu,cpuacct:/x\n11:memory:/docker/abc\n", map[string]string{"memory/docker/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20, true},
		{"v1 unlimited", "11:memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"escape", "0::/../../../etc\n", map[string]string{"etc/memory.max": "4096\n"}, 4096, true},
		{"garbage", "nonsense\n", nil, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "cgroup")
			write(t, filepath.Join(dir, "proc-cgroup"), c.proc)
			for name, s := range c.files {
				write(t, filepath.Join(root, name), s)
			}
			got, ok := cgroupMemoryMax(filepath.Join(dir, "proc-cgroup"), root)
			if got != c.want || ok != c.ok {
				t.Errorf("got %d, %v; want %d, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// TestSetMemoryLimitHonoursGOMEMLIMIT: a GOMEMLIMIT the operator set is left to the runtime.
func TestSetMemoryLimitHonoursGOMEMLIMIT(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if got := setMemoryLimit(func(k string) string {
		if k == "GOMEMLIMIT" {
			return "800MiB"
		}
		return ""
	}, log); got != 0 {
		t.Errorf("with GOMEMLIMIT set, setMemoryLimit set %d", got)
	}
	if after := debug.SetMemoryLimit(-1); after != before {
		t.Errorf("the memory limit changed from %d to %d", before, after)
	}
}
