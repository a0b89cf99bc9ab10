package agentrun

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// TestStore runs on a real redis-server and on the embedded Redis (sandboxd's default).
func TestStore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testing.TB) *redistest.Server
	}{{"redis-server", redistest.Start}, {"embedded", redistest.Embedded}} {
		t.Run(tc.name, func(t *testing.T) { testStore(t, New(tc.start(t).Client, Options{KeepPerSandbox: 3})) })
	}
}

func testStore(t *testing.T, s *Store) {
	ctx := context.Background()
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	for i := range 5 {
		r := Record{ID: fmt.Sprintf("run_%d", i), Tenant: "t", Project: "p", Sandbox: "sbx_1", Agent: "a", Model: "m",
			RunDir: "/workspace/.agent-runs/x", CreatedAt: t0.Add(time.Duration(i) * time.Second)}
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.List(ctx, "sbx_1", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range list {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[run_4 run_3 run_2]" {
		t.Fatalf("list: got %v, want [run_4 run_3 run_2] (newest first, trimmed to 3)", ids)
	}
	if _, err := s.Get(ctx, "run_0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("trimmed run: got %v, want ErrNotFound", err)
	}
	if err := s.SetExec(ctx, "run_4", "exec_1", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, "run_4"); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "run_4", "CANCELLED", "cancelled", -1, "SIGKILL", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// The first final status stays.
	if err := s.Finish(ctx, "run_4", "FAILED", "late", 1, "", t0); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "run_4")
	if err != nil {
		t.Fatal(err)
	}
	want := Record{ID: "run_4", Tenant: "t", Project: "p", Sandbox: "sbx_1", Agent: "a", Model: "m", RunDir: "/workspace/.agent-runs/x",
		CreatedAt: t0.Add(4 * time.Second), ExecID: "exec_1", StartedAt: t0, Cancelled: true, Status: "CANCELLED",
		Reason: "cancelled", ExitCode: -1, Signal: "SIGKILL", EndedAt: t0.Add(time.Minute)}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for name, err := range map[string]error{
		"set":    s.SetExec(ctx, "run_nope", "exec_1", t0),
		"cancel": s.Cancel(ctx, "run_nope"),
		"finish": s.Finish(ctx, "run_nope", "FAILED", "", 1, "", t0),
	} {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s of a missing run: got %v, want ErrNotFound", name, err)
		}
	}
	if _, err := s.Get(ctx, "run_nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a write to a missing run created it")
	}
}
