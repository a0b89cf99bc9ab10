package server_test

import (
	"strings"
	"testing"
	"time"

	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestSetEnv(t *testing.T) {
	h := guesttest.New(t, server.Options{BaseEnv: []string{"PATH=/usr/bin:/bin", "HOME=/root", "PROFILE=p"}}, guesttest.OverNetPipe)
	ctx := guesttest.Ctx(t, 20*time.Second)
	run := func(id string, env ...string) string {
		t.Helper()
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", `echo "$PROFILE|$A|$B|$HOME"`}, Env: env}, 1<<16, 1<<16)
		if err != nil {
			t.Fatalf("Run %s: %v", id, err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	if got, want := run("before"), "p|||/root"; got != want {
		t.Fatalf("before SetEnv: got %q, want %q", got, want)
	}
	res, err := h.C.SetEnv(ctx, []string{"A=1", "B=x", "A=2", "PROFILE=caller"})
	if err != nil {
		t.Fatalf("SetEnv: %v", err)
	}
	if res.Entries != 3 {
		t.Fatalf("SetEnv entries: got %d, want 3", res.Entries)
	}
	if got, want := run("after"), "caller|2|x|/root"; got != want {
		t.Fatalf("after SetEnv: got %q, want %q", got, want)
	}
	if got, want := run("exec-wins", "B=exec"), "caller|2|exec|/root"; got != want {
		t.Fatalf("an exec's own env: got %q, want %q", got, want)
	}
	// A later call replaces the laid-over environment; the base stays.
	if _, err := h.C.SetEnv(ctx, []string{"B=y"}); err != nil {
		t.Fatalf("SetEnv again: %v", err)
	}
	if got, want := run("replaced"), "p||y|/root"; got != want {
		t.Fatalf("after a second SetEnv: got %q, want %q", got, want)
	}
}

func TestSetEnvRefusals(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverNetPipe)
	ctx := guesttest.Ctx(t, 20*time.Second)
	many := make([]string, proto.MaxEnvEntries+1)
	for i := range many {
		many[i] = "K=v"
	}
	tests := []struct {
		name string
		env  []string
		code string
	}{
		{name: "no-equals", env: []string{"JUSTKEY"}, code: proto.ErrCodeInvalid},
		{name: "empty-key", env: []string{"=v"}, code: proto.ErrCodeInvalid},
		{name: "nul", env: []string{"K=a\x00b"}, code: proto.ErrCodeInvalid},
		{name: "too-many", env: many, code: proto.ErrCodeInvalid},
		{name: "too-big", env: []string{"K=" + strings.Repeat("x", proto.MaxEnvBytes)}, code: proto.ErrCodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.C.SetEnv(ctx, tt.env)
			wantCode(t, err, tt.code)
		})
	}
	// Nothing refused was kept.
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "check", Argv: []string{"sh", "-c", `echo "[$K]"`}}, 1<<16, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "[]" {
		t.Fatalf("after refusals: got %q, want []", got)
	}
}
