package localredis

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

func requireRedisServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (scripts/test.sh installs it): %v", err)
		}
		t.Skipf("redis-server not found; run scripts/test.sh, which installs it: %v", err)
	}
}

func start(t *testing.T, dir string, fsync string) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.AppendFsync = fsync
	s, err := Start(context.Background(), Options{Config: cfg, Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func client(t *testing.T, s *Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(s.ClientOptions())
	t.Cleanup(func() { c.Close() })
	return c
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && b[i+2] != 'Z'
}

func waitFor(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The folder and socket are the owner's only, there is no TCP port, and the server runs with
// AOF on, noeviction and the configured maxmemory.
func TestStartPrivateAndConfigured(t *testing.T) {
	requireRedisServer(t)
	dir := filepath.Join(t.TempDir(), "redis")
	if err := os.MkdirAll(dir, 0o777); err != nil { // a wider folder is narrowed
		t.Fatal(err)
	}
	s := start(t, dir, "everysec")
	for path, want := range map[string]os.FileMode{dir: 0o700, s.Socket(): 0o700} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: got mode %o, want %o", path, got, want)
		}
	}
	c := client(t, s)
	ctx := context.Background()
	for k, want := range map[string]string{"appendonly": "yes", "maxmemory-policy": "noeviction", "port": "0",
		"maxmemory": strconv.Itoa(1 << 30), "save": "", "protected-mode": "yes", "appendfsync": "everysec"} {
		got, err := c.ConfigGet(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got[k] != want {
			t.Errorf("CONFIG GET %s: got %q, want %q", k, got[k], want)
		}
	}
	// A second sandboxd on the same folder is refused.
	_, err := Start(ctx, Options{Config: DefaultConfig(), Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err == nil || !strings.Contains(err.Error(), "locked by another sandboxd") {
		t.Errorf("second Start on %s: got %v, want a locked error", dir, err)
	}
}

// A child killed with SIGKILL is restarted, counted, and has what it had fsynced; Close
// SHUTDOWNs it, and a new Start on the folder finds every key.
func TestRestartKeepsData(t *testing.T) {
	requireRedisServer(t)
	dir := filepath.Join(t.TempDir(), "redis")
	s := start(t, dir, "always")
	c := client(t, s)
	ctx := context.Background()
	if err := c.Set(ctx, "k1", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "out", Values: []string{"data", "hello"}}).Err(); err != nil {
		t.Fatal(err)
	}
	pid := s.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// While it is down a command fails; after the restart it answers with the data.
	waitFor(t, "restart", 10*time.Second, func() bool { return s.Restarts() == 1 && s.Up() && s.PID() != pid })
	if got, err := c.Get(ctx, "k1").Result(); err != nil || got != "v1" {
		t.Errorf("after SIGKILL and restart: GET k1 = %q, %v; want v1", got, err)
	}
	if n, err := c.XLen(ctx, "out").Result(); err != nil || n != 1 {
		t.Errorf("after SIGKILL and restart: XLEN out = %d, %v; want 1", n, err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	if got["sandboxd_redis_restarts_total"] != 1 || got["sandboxd_redis_up"] != 1 || got["sandboxd_redis_used_memory_bytes"] <= 0 ||
		got["sandboxd_redis_maxmemory_bytes"] != 1<<30 {
		t.Errorf("metrics: got %v, want restarts 1, up 1, used_memory > 0, maxmemory 1 GiB (the default)", got)
	}
	if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	pid = s.PID()
	s.Close()
	if alive(pid) {
		t.Errorf("redis-server %d still runs after Close", pid)
	}
	if _, err := os.Stat(filepath.Join(dir, pidName)); !os.IsNotExist(err) {
		t.Errorf("pidfile after Close: %v, want it removed", err)
	}
	s2 := start(t, dir, "everysec")
	c2 := client(t, s2)
	for k, want := range map[string]string{"k1": "v1", "k2": "v2"} {
		if got, err := c2.Get(ctx, k).Result(); err != nil || got != want {
			t.Errorf("after Close and Start: GET %s = %q, %v; want %q", k, got, err, want)
		}
	}
}

// A redis-server left running in the folder (its PID in the pidfile) is ended by that PID
// before the new one starts; a pidfile naming another process leaves that process alone.
func TestEndsLeftover(t *testing.T) {
	requireRedisServer(t)
	dir := filepath.Join(t.TempDir(), "redis")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	left := exec.Command("redis-server", "--port", "0", "--unixsocket", filepath.Join(dir, SocketName), "--dir", dir, "--save", "", "--logfile", filepath.Join(dir, "left.log"))
	left.Dir = dir
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { left.Wait(); close(exited) }()
	t.Cleanup(func() { left.Process.Kill(); <-exited })
	if err := os.WriteFile(filepath.Join(dir, pidName), []byte(strconv.Itoa(left.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, dir, "everysec")
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("the leftover redis-server %d still runs after Start", left.Process.Pid)
	}
	if s.PID() == left.Process.Pid || !s.Up() {
		t.Errorf("got pid %d up=%v, want a new child", s.PID(), s.Up())
	}
	s.Close()

	// A pidfile that names this test process (not a redis-server in the folder): untouched.
	if err := os.WriteFile(filepath.Join(dir, pidName), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, dir, "everysec") // the test would die here if it were signalled
}

func TestMissingBinaryNamesPackage(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Binary = "redis-server-not-installed-here"
	_, err := Start(context.Background(), Options{Config: cfg, Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Errorf("got %v, want an error naming the redis-server package", err)
	}
}

func TestLongSocketPathRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	_, err := Start(context.Background(), Options{Config: DefaultConfig(), Dir: dir})
	if requireBin := exec.Command("redis-server", "--version").Run(); requireBin != nil {
		t.Skip("redis-server not installed")
	}
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("got %v, want a socket path error", err)
	}
}

func TestConfigValidate(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name    string
		mod     func(*Config)
		haveURL bool
		want    string
	}{
		{"defaults", func(*Config) {}, false, ""},
		{"defaults-with-url", func(*Config) {}, true, ""},
		{"embedded-and-url", func(c *Config) { c.Embedded = &yes }, true, "choose one"},
		{"no-redis", func(c *Config) { c.Embedded = &no }, false, "needs a Redis"},
		{"bad-fsync", func(c *Config) { c.AppendFsync = "no" }, false, "everysec or always"},
		{"tiny-maxmemory", func(c *Config) { c.MaxMemory = "1mb" }, false, "at least 16mb"},
		{"bad-maxmemory", func(c *Config) { c.MaxMemory = "lots" }, false, "a size"},
		{"empty-binary", func(c *Config) { c.Binary = "" }, false, "binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate(tc.haveURL)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
	for in, want := range map[string]int64{"256mb": 256 << 20, "1gb": 1 << 30, "1000": 1000, "2k": 2000, "64MB": 64 << 20} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}
