package gvisor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"sandboxd/runtime"
)

func TestBuildSpec(t *testing.T) {
	spec := runtime.BoxSpec{
		Rootfs:      "/srv/rootfs",
		MilliCPU:    1500,
		MemoryBytes: 1 << 30,
		Env:         map[string]string{"FOO": "bar", "PATH": "/opt/bin:/usr/bin"},
	}
	oci, err := buildSpec("sbx_1", spec, "/state/boxes/sbx_1/workspace", "/state/init", "", false, boxNetwork{})
	if err != nil {
		t.Fatal(err)
	}
	if !oci.Root.Readonly || oci.Root.Path != "/srv/rootfs" {
		t.Errorf("got root %+v, want /srv/rootfs read-only", oci.Root)
	}
	if got := oci.Process.Args; !slices.Equal(got, []string{"/.sbx/init"}) {
		t.Errorf("got args %q, want [/.sbx/init]", got)
	}
	if oci.Process.Terminal || !oci.Process.NoNewPrivileges || oci.Process.Cwd != "/workspace" {
		t.Errorf("got process %+v, want no terminal, noNewPrivileges, cwd /workspace", oci.Process)
	}
	wantEnv := []string{"FOO=bar", "HOME=/root", "LANG=C.UTF-8", "PATH=/opt/bin:/usr/bin", "SBX_REQUIRE_CONTAINMENT=1", "SBX_STOP_SIGNALS=0"}
	if !slices.Equal(oci.Process.Env, wantEnv) {
		t.Errorf("got env %q, want %q", oci.Process.Env, wantEnv)
	}
	// PID 1 alone starts with CAP_SYS_ADMIN (and drops it); the connect relay has nothing.
	for name, set := range map[string][]string{"bounding": oci.Process.Capabilities.Bounding,
		"effective": oci.Process.Capabilities.Effective, "permitted": oci.Process.Capabilities.Permitted} {
		if !slices.Contains(set, "CAP_SYS_ADMIN") || !slices.Contains(set, "CAP_KILL") {
			t.Errorf("PID 1's %s set %q: want the commands' set and CAP_SYS_ADMIN", name, set)
		}
	}
	if slices.Contains(dockerCaps, "CAP_SYS_ADMIN") {
		t.Errorf("the commands' capability set holds CAP_SYS_ADMIN")
	}
	cp := connectProcess()
	if c := cp.Capabilities; len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable) != 0 || !cp.NoNewPrivileges {
		t.Errorf("connect process %+v: want no capability and noNewPrivileges", cp)
	}
	withHost, err := buildSpec("sbx_1", spec, "/state/boxes/sbx_1/workspace", "/state/init", "/state/boxes/sbx_1/host", true, boxNetwork{})
	if err != nil {
		t.Fatal(err)
	}
	// A driver with a spawner program tells PID 1 where it is (SBX_SPAWNER); without one
	// (above) nothing does.
	if !slices.Contains(withHost.Process.Env, "SBX_SPAWNER=/.sbx/spawn") {
		t.Errorf("env with a spawner program %q: want SBX_SPAWNER=/.sbx/spawn", withHost.Process.Env)
	}
	for _, kv := range []string{"SBX_HOST_SOCKET=/run/sbx/host/init.sock", "SBX_CHANNEL_KEY_FILE=/run/sbx/host/channel.key"} {
		if !slices.Contains(withHost.Process.Env, kv) {
			t.Errorf("env with a host folder %q: want %s", withHost.Process.Env, kv)
		}
	}
	if r := oci.Process.Rlimits; len(r) != 1 || r[0].Type != "RLIMIT_NOFILE" || r[0].Soft != 65536 {
		t.Errorf("got rlimits %+v, want RLIMIT_NOFILE 65536", r)
	}
	mounts := map[string]ociMount{}
	for _, m := range oci.Mounts {
		mounts[m.Destination] = m
	}
	for _, tc := range []struct {
		dest, typ, source, option string
	}{
		{"/proc", "proc", "proc", ""},
		{"/dev", "tmpfs", "tmpfs", ""},
		{"/dev/pts", "devpts", "devpts", "newinstance"},
		{"/dev/shm", "tmpfs", "shm", "size=67108864"},
		{"/sys", "sysfs", "sysfs", "ro"},
		{"/tmp", "tmpfs", "tmpfs", "mode=1777"},
		{"/run/sbx", "tmpfs", "tmpfs", ""},
		{"/workspace", "bind", "/state/boxes/sbx_1/workspace", "rw"},
		{"/.sbx", "bind", "/state/init", "ro"},
	} {
		m, ok := mounts[tc.dest]
		if !ok {
			t.Errorf("no mount at %s", tc.dest)
			continue
		}
		if m.Type != tc.typ || m.Source != tc.source || (tc.option != "" && !slices.Contains(m.Options, tc.option)) {
			t.Errorf("got mount %+v, want type %s source %s option %q", m, tc.typ, tc.source, tc.option)
		}
	}
	res := oci.Linux.Resources
	if res.Memory == nil || res.Memory.Limit != 1<<30 {
		t.Errorf("got memory %+v, want 1 GiB", res.Memory)
	}
	if res.CPU == nil || res.CPU.Quota != 150000 || res.CPU.Period != 100000 {
		t.Errorf("got cpu %+v, want quota 150000 period 100000", res.CPU)
	}
	if res.Pids == nil || res.Pids.Limit != DefaultPidsLimit {
		t.Errorf("got pids %+v, want %d", res.Pids, DefaultPidsLimit)
	}
	if oci.Linux.CgroupsPath != "/sbx_1" {
		t.Errorf("got cgroups path %q, want /sbx_1", oci.Linux.CgroupsPath)
	}
	var ns []string
	for _, n := range oci.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	if want := []string{"pid", "network", "ipc", "uts", "mount"}; !slices.Equal(ns, want) {
		t.Errorf("got namespaces %q, want %q", ns, want)
	}
	if _, err := json.Marshal(oci); err != nil {
		t.Fatal(err)
	}
}

func TestBuildSpecNoLimits(t *testing.T) {
	oci, err := buildSpec("sbx_1", runtime.BoxSpec{Rootfs: "/r", PidsLimit: 100}, "/w", "/i", "", false, boxNetwork{})
	if err != nil {
		t.Fatal(err)
	}
	if r := oci.Linux.Resources; r.Memory != nil || r.CPU != nil || r.Pids.Limit != 100 {
		t.Errorf("got resources %+v, want only pids 100", r)
	}
}

func TestValidateSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec runtime.BoxSpec
		ok   bool
	}{
		{"Minimal", runtime.BoxSpec{Rootfs: "/r"}, true},
		{"NetworkNone", runtime.BoxSpec{Rootfs: "/r", Network: "none"}, true},
		{"NoRootfs", runtime.BoxSpec{}, false},
		{"RelativeRootfs", runtime.BoxSpec{Rootfs: "r"}, false},
		{"HostRoot", runtime.BoxSpec{Rootfs: "/"}, false},
		{"HostNetwork", runtime.BoxSpec{Rootfs: "/r", Network: "host"}, false},
		{"NegativeMemory", runtime.BoxSpec{Rootfs: "/r", MemoryBytes: -1}, false},
		{"TinyMemory", runtime.BoxSpec{Rootfs: "/r", MemoryBytes: 1 << 20}, false},
		{"EnvEquals", runtime.BoxSpec{Rootfs: "/r", Env: map[string]string{"A=B": ""}}, false},
		{"EnvNul", runtime.BoxSpec{Rootfs: "/r", Env: map[string]string{"A": "\x00"}}, false},
		{"EnvReserved", runtime.BoxSpec{Rootfs: "/r", Env: map[string]string{"SBX_REAP": "0"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := validateSpec(tc.spec); (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV", true},
		{"a", true},
		{"a-b_c", true},
		{"", false},
		{"-a", false},
		{"_a", false},
		{"a/b", false},
		{"..", false},
		{"a:b", false},
		{"a b", false},
		{strings.Repeat("a", MaxIDLen), true},
		{strings.Repeat("a", MaxIDLen+1), false},
	} {
		if got := ValidID(tc.id); got != tc.ok {
			t.Errorf("ValidID(%q): got %v, want %v", tc.id, got, tc.ok)
		}
	}
}

func TestFieldValue(t *testing.T) {
	v1 := []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
	if n, ok := fieldValue(v1, "oom_kill"); !ok || n != 3 {
		t.Errorf("got %d %v, want 3 true", n, ok)
	}
	if _, ok := fieldValue(v1, "missing"); ok {
		t.Errorf("found a missing key")
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, content := range []string{"one", "two"} {
		if err := writeFileAtomic(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != content {
			t.Errorf("got %q, want %q", b, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("got %d files, want 1 (no temporary file left)", len(entries))
	}
}

func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	var wg sync.WaitGroup
	counter := 0
	for i := 0; i < 50; i++ {
		wg.Go(func() {
			unlock := k.lock("a")
			counter++
			unlock()
		})
	}
	wg.Wait()
	if counter != 50 {
		t.Errorf("got %d, want 50", counter)
	}
	if len(k.m) != 0 {
		t.Errorf("got %d entries left, want 0", len(k.m))
	}
}

// TestSpawnerBinaryOption: the spawner program is found beside the init binary as
// sandbox-spawn, taken from SpawnerBinary when set, and an explicit one that is not an
// executable file is refused at once (not at every create).
func TestSpawnerBinaryOption(t *testing.T) {
	dir := t.TempDir()
	initBin := filepath.Join(dir, "sandbox-init")
	if err := os.WriteFile(initBin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	newDriver := func(spawner string) (*Driver, error) {
		return New(Options{Runsc: "/bin/true", StateDir: filepath.Join(dir, "state"), InitBinary: initBin,
			SpawnerBinary: spawner, Mkfs: "/bin/true"})
	}
	d, err := newDriver("")
	if err != nil {
		t.Fatal(err)
	}
	if d.opts.SpawnerBinary != "" {
		t.Fatalf("no sandbox-spawn beside the init: got %q, want none", d.opts.SpawnerBinary)
	}
	d.Close()
	beside := filepath.Join(dir, "sandbox-spawn")
	if err := os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d, err = newDriver(""); err != nil || d.opts.SpawnerBinary != beside {
		t.Fatalf("sandbox-spawn beside the init: got %q, %v", d.opts.SpawnerBinary, err)
	}
	// Readiness: every create copies it into the box, so a program gone since is reported.
	if err := os.Remove(beside); err != nil {
		t.Fatal(err)
	}
	if err := d.Check(t.Context()); err == nil || !strings.Contains(err.Error(), "spawner program") {
		t.Errorf("Check with the spawner program gone: got %v, want it named", err)
	}
	d.Close()
	if _, err := newDriver(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "not an executable file") {
		t.Fatalf("a missing spawner program: got %v, want refused", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newDriver(filepath.Join(dir, "plain")); err == nil {
		t.Fatal("a spawner program that is not executable: accepted")
	}
}
