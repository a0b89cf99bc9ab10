package server_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"sandboxd/guest/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// modes runs f once per process-waiting strategy.
func modes(t *testing.T, f func(t *testing.T, reap bool)) {
	for _, reap := range []bool{false, true} {
		name := "wait"
		if reap {
			name = "reap"
		}
		t.Run(name, func(t *testing.T) { f(t, reap) })
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
