package runtimetest

import (
	"strings"
	"sync"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

func testIsolation(t *testing.T, d runtime.Driver, spec runtime.BoxSpec, ownTmp bool) {
	ids := make([]string, 2)
	var wg sync.WaitGroup
	for i := range ids {
		rec := NewRecord(spec)
		ids[i] = rec.ID
		wg.Go(func() {
			if err := d.Create(ctxT(t), rec); err != nil {
				t.Errorf("Create %s: %v", rec.ID, err)
				return
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		t.Cleanup(func() { deleteBox(t, d, id) })
	}
	if t.Failed() {
		t.FailNow()
	}
	c0, c1 := Client(t, d, ids[0]), Client(t, d, ids[1])
	// A new box's workspace is empty.
	res := MustRun(t, c1, proto.ExecRequest{Argv: []string{"sh", "-c", "ls -A | wc -l"}})
	if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
		t.Errorf("a new box's workspace has %s entries, want 0", got)
	}
	write, list := "echo secret > only-here", "ls -A"
	if ownTmp {
		write, list = write+" && touch /tmp/only-here", list+"; ls /tmp"
	}
	MustRun(t, c0, proto.ExecRequest{Argv: []string{"sh", "-c", write}})
	res = MustRun(t, c1, proto.ExecRequest{Argv: []string{"sh", "-c", list}})
	if strings.Contains(string(res.Stdout), "only-here") {
		t.Errorf("box %s sees the other box's file: %q", ids[1], res.Stdout)
	}
	res = MustRun(t, c0, proto.ExecRequest{Argv: []string{"cat", "only-here"}})
	if string(res.Stdout) != "secret\n" {
		t.Errorf("got %q, want %q", res.Stdout, "secret\n")
	}
	// Stopping one leaves the other running.
	if err := d.Stop(ctxT(t), ids[0]); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if b := mustGet(t, d, ids[1]); b.Phase != runtime.PhaseRunning {
		t.Errorf("the other box is %s (%s), want running", b.Phase, b.Reason)
	}
	MustRun(t, c1, proto.ExecRequest{Argv: []string{"true"}})
}
