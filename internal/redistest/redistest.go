// Package redistest starts a real redis-server for tests, one per call, on a free loopback port,
// and stops it by PID when the test ends. Tests that need Redis use this rather than sharing a
// server, so that FLUSHALL in one test cannot disturb another. Outside CI a missing
// redis-server skips the test; in CI (CI=true) it fails.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	URL    string
	Addr   string
	Client *redis.Client

	stop func()
}

// Stop stops the server before the test ends (to test what happens without Redis).
func (s *Server) Stop() { s.stop() }

// Start runs a real redis-server for the duration of t.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (scripts/test.sh installs it): %v", err)
		}
		t.Skipf("redis-server not found; run scripts/test.sh, which installs it: %v", err)
	}
	port := freePort(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server did not answer: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Server{URL: "redis://" + addr + "/0", Addr: addr, Client: rdb, stop: stop}
}

// Embedded starts an in-process miniredis for the duration of t: for unit tests only (the
// server itself runs a real redis-server, internal/localredis).
func Embedded(t testing.TB) *Server {
	t.Helper()
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		t.Fatalf("miniredis: %v", err)
	}
	t.Cleanup(mr.Close)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return &Server{URL: "redis://" + mr.Addr() + "/0", Addr: mr.Addr(), Client: rdb, stop: mr.Close}
}

// Both runs f against a real redis-server and against the embedded one.
func Both(t *testing.T, f func(t *testing.T, s *Server)) {
	t.Run("redis-server", func(t *testing.T) { f(t, Start(t)) })
	t.Run("embedded", func(t *testing.T) { f(t, Embedded(t)) })
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
