package runtimetest

import (
	"errors"
	"maps"
	"sync"
	"testing"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

func testLifecycle(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	rec := NewRecord(spec)
	id := rec.ID
	outer := t
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	step("Create", func(t *testing.T) {
		if err := d.Create(ctxT(t), rec); err != nil {
			t.Fatalf("Create: %v", err)
		}
		outer.Cleanup(func() { deleteBox(outer, d, id) })
	})
	step("GetRunning", func(t *testing.T) {
		b := mustGet(t, d, id)
		if b.Phase != runtime.PhaseRunning {
			t.Errorf("got phase %s (%s), want running", b.Phase, b.Reason)
		}
		if got, want := jsonOf(t, b.Record), jsonOf(t, rec); got != want {
			t.Errorf("got record %s, want %s", got, want)
		}
	})
	step("ListContains", func(t *testing.T) {
		boxes, err := d.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		found := false
		for _, b := range boxes {
			if b.Record.ID == id {
				found = true
				if b.Phase != runtime.PhaseRunning {
					t.Errorf("got listed phase %s, want running", b.Phase)
				}
			}
		}
		if !found {
			t.Errorf("List has no box %s", id)
		}
	})
	step("CreateTwice", func(t *testing.T) {
		if err := d.Create(ctxT(t), rec); !errors.Is(err, runtime.ErrExists) {
			t.Errorf("second Create: got %v, want ErrExists", err)
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseRunning {
			t.Errorf("after a refused Create: got phase %s, want running", b.Phase)
		}
	})
	step("AttachExec", func(t *testing.T) {
		c := Client(t, d, id)
		if _, err := c.Health(ctxT(t)); err != nil {
			t.Fatalf("Health: %v", err)
		}
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo hi > f && pwd"}})
		if res.Exit.ExitCode != 0 {
			t.Fatalf("got exit %+v, stderr %q, want 0", res.Exit, res.Stderr)
		}
	})
	step("SecondAttachSeesFile", func(t *testing.T) {
		c := Client(t, d, id)
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"cat", "f"}})
		if got := string(res.Stdout); got != "hi\n" || res.Exit.ExitCode != 0 {
			t.Errorf("got %q (exit %+v), want %q", got, res.Exit, "hi\n")
		}
		res = MustRun(t, c, proto.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 42"}})
		if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.Exit.ExitCode != 42 {
			t.Errorf("got stdout %q stderr %q exit %d, want out, err, 42", res.Stdout, res.Stderr, res.Exit.ExitCode)
		}
	})
	step("UpdateRecord", func(t *testing.T) {
		got, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error {
			r.State = "RUNNING"
			r.LatestCheckpoint = "ckpt-1"
			if r.Annotations == nil {
				r.Annotations = map[string]string{}
			}
			r.Annotations["k"] = "v"
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateRecord: %v", err)
		}
		b := mustGet(t, d, id)
		if jsonOf(t, b.Record) != jsonOf(t, got) || got.State != "RUNNING" || got.Annotations["k"] != "v" || got.Tenant != rec.Tenant {
			t.Errorf("got stored %s, returned %s, want the update applied", jsonOf(t, b.Record), jsonOf(t, got))
		}
		boom := errors.New("boom")
		if _, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error { r.State = "X"; return boom }); !errors.Is(err, boom) {
			t.Errorf("got %v, want fn's error", err)
		}
		if b := mustGet(t, d, id); b.Record.State != "RUNNING" {
			t.Errorf("a failed update was stored: state %q", b.Record.State)
		}
	})
	// The labels are part of the record: an update replaces them (here: one changed, one
	// removed, one added), Get and List report them, and a restart keeps them (below).
	labels := map[string]string{"suite": "conformance-2", "example.com/tier": "gold", "added": "yes"}
	step("UpdateLabels", func(t *testing.T) {
		got, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error {
			r.Labels = maps.Clone(labels)
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateRecord: %v", err)
		}
		if !maps.Equal(got.Labels, labels) {
			t.Errorf("got labels %v returned, want %v", got.Labels, labels)
		}
		if b := mustGet(t, d, id); !maps.Equal(b.Record.Labels, labels) {
			t.Errorf("got labels %v stored, want %v", b.Record.Labels, labels)
		}
		boxes, err := d.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, b := range boxes {
			if b.Record.ID == id && !maps.Equal(b.Record.Labels, labels) {
				t.Errorf("got labels %v listed, want %v", b.Record.Labels, labels)
			}
		}
	})
	step("ConcurrentUpdates", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Go(func() {
				_, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error {
					r.AutostopSec++
					return nil
				})
				if err != nil {
					t.Errorf("UpdateRecord: %v", err)
				}
			})
		}
		wg.Wait()
		if b := mustGet(t, d, id); b.Record.AutostopSec != rec.AutostopSec+8 {
			t.Errorf("got autostop %d after 8 increments, want %d", b.Record.AutostopSec, rec.AutostopSec+8)
		}
	})
	step("Stop", func(t *testing.T) {
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseStopped {
			t.Errorf("got phase %s (%s), want stopped", b.Phase, b.Reason)
		}
		if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotRunning) {
			t.Errorf("Attach to a stopped box: got %v, want ErrNotRunning", err)
		}
	})
	step("StopTwice", func(t *testing.T) {
		if err := d.Stop(ctxT(t), id); err != nil {
			t.Errorf("second Stop: %v", err)
		}
	})
	step("StartKeepsWorkspace", func(t *testing.T) {
		fresh, err := d.Start(ctxT(t), id)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		if fresh {
			t.Errorf("got fresh = true, want false (the workspace was kept)")
		}
		if b := mustGet(t, d, id); b.Phase != runtime.PhaseRunning {
			t.Errorf("got phase %s (%s), want running", b.Phase, b.Reason)
		}
		c := Client(t, d, id)
		res := MustRun(t, c, proto.ExecRequest{Argv: []string{"cat", "f"}})
		if string(res.Stdout) != "hi\n" {
			t.Errorf("after restart got %q, want %q", res.Stdout, "hi\n")
		}
		if b := mustGet(t, d, id); !maps.Equal(b.Record.Labels, labels) {
			t.Errorf("after restart got labels %v, want %v", b.Record.Labels, labels)
		}
	})
	step("StartRunning", func(t *testing.T) {
		fresh, err := d.Start(ctxT(t), id)
		if err != nil || fresh {
			t.Errorf("Start of a running box: got (%v, %v), want (false, nil)", fresh, err)
		}
	})
	step("Delete", func(t *testing.T) {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Get after Delete: got %v, want ErrNotFound", err)
		}
		boxes, err := d.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, b := range boxes {
			if b.Record.ID == id {
				t.Errorf("List still has %s", id)
			}
		}
	})
	step("DeleteTwice", func(t *testing.T) {
		if err := d.Delete(ctxT(t), id); err != nil {
			t.Errorf("second Delete: %v", err)
		}
	})
}

func testUnknown(t *testing.T, d runtime.Driver) {
	id := NewID()
	if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Get: got %v, want ErrNotFound", err)
	}
	if _, err := d.Start(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Start: got %v, want ErrNotFound", err)
	}
	if err := d.Stop(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stop: got %v, want ErrNotFound", err)
	}
	if _, err := d.Attach(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Attach: got %v, want ErrNotFound", err)
	}
	if _, err := d.UpdateRecord(ctxT(t), id, func(*runtime.Record) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("UpdateRecord: got %v, want ErrNotFound", err)
	}
	if err := d.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete: got %v, want nil", err)
	}
}
