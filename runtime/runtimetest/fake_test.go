package runtimetest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFakeConformance(t *testing.T) {
	Run(t, func(t *testing.T) runtime.Driver { return NewFakeT(t) }, runtime.BoxSpec{Profile: "test"}, SkipHostIsolation())
}

func TestFakeKill(t *testing.T) {
	f := NewFakeT(t)
	id := CreateBox(t, f, runtime.BoxSpec{Profile: "test"})
	c := Client(t, f, id)
	if _, err := c.StartExec(ctxT(t), proto.ExecRequest{ID: NewExecID(), Argv: []string{"sleep", "30"}}); err != nil {
		t.Fatalf("StartExec: %v", err)
	}
	if err := f.Kill(id, "out of memory"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	b := mustGet(t, f, id)
	if b.Phase != runtime.PhaseFailed || b.Reason != "out of memory" {
		t.Errorf("got phase %s reason %q, want failed, %q", b.Phase, b.Reason, "out of memory")
	}
	select {
	case <-c.Done():
	case <-ctxT(t).Done():
		t.Fatal("the attach survived the crash")
	}
	if _, err := f.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("Attach to a failed box: got %v, want ErrNotRunning", err)
	}
	fresh, err := f.Start(ctxT(t), id)
	if err != nil || fresh {
		t.Fatalf("Start of a failed box: got (%v, %v), want (false, nil)", fresh, err)
	}
	if b := mustGet(t, f, id); b.Phase != runtime.PhaseRunning || b.Reason != "" {
		t.Errorf("got phase %s reason %q, want running", b.Phase, b.Reason)
	}
}

func TestFakeFreshWorkspace(t *testing.T) {
	f := NewFakeT(t)
	id := CreateBox(t, f, runtime.BoxSpec{Profile: "test"})
	MustRun(t, Client(t, f, id), proto.ExecRequest{Argv: []string{"touch", "x"}})
	if err := f.Stop(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(f.Workspace(id)); err != nil {
		t.Fatal(err)
	}
	fresh, err := f.Start(ctxT(t), id)
	if err != nil || !fresh {
		t.Fatalf("Start without a workspace: got (%v, %v), want (true, nil)", fresh, err)
	}
	res := MustRun(t, Client(t, f, id), proto.ExecRequest{Argv: []string{"ls", "-A"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != "" {
		t.Errorf("fresh workspace holds %q, want nothing", got)
	}
}

func TestFakeFailNext(t *testing.T) {
	f := NewFakeT(t)
	boom := errors.New("boom")
	for _, tc := range []struct {
		method string
		call   func() error
	}{
		{"Create", func() error { return f.Create(context.Background(), NewRecord(runtime.BoxSpec{})) }},
		{"List", func() error { _, err := f.List(context.Background()); return err }},
		{"Check", func() error { return f.Check(context.Background()) }},
	} {
		t.Run(tc.method, func(t *testing.T) {
			f.FailNext(tc.method, boom)
			if err := tc.call(); !errors.Is(err, boom) {
				t.Errorf("first call: got %v, want boom", err)
			}
			if err := tc.call(); err != nil {
				t.Errorf("second call: got %v, want nil", err)
			}
		})
	}
}
