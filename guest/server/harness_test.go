package server_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		// The test binary started as a command by a test (see helpers).
		os.Exit(helpers[h]())
	}
	goleak.VerifyTestMain(m)
}

// helperEnv names the helper the test binary runs as when a test starts it as a command.
const helperEnv = "GUEST_SERVER_TEST_HELPER"

// helpers are commands the tests need that no shell tool does, run by the test binary itself.
var helpers = map[string]func() int{
	"tty-hostile": ttyHostile,
}

// helperCommand is the argv and env of an exec that runs helper name.
func helperCommand(t testing.TB, name string) ([]string, []string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self}, []string{helperEnv + "=" + name}
}

// modes runs f once per way of starting and waiting for processes: each process waited for
// on its own, one reaper for all, and the reaper with the spawner program starting them.
func modes(t *testing.T, f func(t *testing.T, opts server.Options)) {
	for _, m := range []string{"wait", "reap", "spawner"} {
		t.Run(m, func(t *testing.T) {
			opts := server.Options{Reap: m != "wait"}
			if m == "spawner" {
				opts.Spawner = guesttest.Spawner(t)
			}
			f(t, opts)
		})
	}
}

func wantCode(t testing.TB, err error, code string) {
	t.Helper()
	var ge *proto.Error
	if !errors.As(err, &ge) {
		t.Fatalf("error: got %v, want a *proto.Error with code %s", err, code)
	}
	if ge.Code != code {
		t.Fatalf("error code: got %s (%s), want %s", ge.Code, ge.Message, code)
	}
}

func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "/") {
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// allocatedPer calls f warm times (first allocations: the connection's, pools', spares'), then
// n times, and returns the bytes this process allocated per call of the n: the server's and its
// client's alike, both run here.
func allocatedPer(warm, n int, f func()) uint64 {
	for range warm {
		f()
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(n)
}
