package runtimetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// testFencing: a write whose fence is lower than one the box has seen is refused with
// ErrFenced before it changes anything (UpdateRecord does not even call its fn); a higher one
// is recorded; the same one again is admitted (a lock holder makes many writes), and a write
// without a fence is not checked.
func testFencing(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	rec := NewRecord(spec)
	id := rec.ID
	// Fences as the operation locks hand them out: about the clock in microseconds.
	base := uint64(time.Now().UnixMicro())
	a, b, c := base, base+10, base+20
	with := func(t *testing.T, fence uint64) context.Context { return runtime.WithFence(ctxT(t), fence) }
	wantFence := func(t *testing.T, want uint64) runtime.Box {
		t.Helper()
		box := mustGet(t, d, id)
		if box.Fence != want {
			t.Fatalf("got box fence %d, want %d", box.Fence, want)
		}
		return box
	}
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, runtime.ErrFenced) {
			t.Fatalf("%s with an older fence: got %v, want ErrFenced", what, err)
		}
	}
	unchanged := func(t *testing.T, before runtime.Box) {
		t.Helper()
		after := mustGet(t, d, id)
		if jsonOf(t, after) != jsonOf(t, before) {
			t.Fatalf("a refused write changed the box: got %s, want %s", jsonOf(t, after), jsonOf(t, before))
		}
	}
	if err := d.Create(with(t, a), rec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { deleteBox(t, d, id) })
	wantFence(t, a)
	// Holder B's first write raises the box's fence above holder A's.
	if _, err := d.UpdateRecord(with(t, b), id, func(r *runtime.Record) error { r.State = "RUNNING"; return nil }); err != nil {
		t.Fatalf("UpdateRecord with a newer fence: %v", err)
	}
	before := wantFence(t, b)
	if before.Phase != runtime.PhaseRunning || before.Record.State != "RUNNING" {
		t.Fatalf("got %s/%s, want a running box in RUNNING", before.Record.State, before.Phase)
	}
	// A, whose lock lapsed, writes on: every write is refused and changes nothing.
	called := false
	_, err := d.UpdateRecord(with(t, a), id, func(r *runtime.Record) error { called = true; r.State = "STOPPED"; return nil })
	refused(t, "UpdateRecord", err)
	if called {
		t.Errorf("a fenced-off UpdateRecord called its fn")
	}
	refused(t, "Stop", d.Stop(with(t, a), id))
	_, err = d.Start(with(t, a), id)
	refused(t, "Start", err)
	refused(t, "Delete", d.Delete(with(t, a), id))
	unchanged(t, before)
	MustRun(t, Client(t, d, id), proto.ExecRequest{Argv: []string{"true"}}) // still running
	// Without a fence nothing is checked and the fence stays.
	if _, err := d.UpdateRecord(ctxT(t), id, func(r *runtime.Record) error { r.StateReason = "unfenced"; return nil }); err != nil {
		t.Fatalf("UpdateRecord without a fence: %v", err)
	}
	wantFence(t, b)
	// B's own writes go on with its fence.
	if err := d.Stop(with(t, b), id); err != nil {
		t.Fatalf("Stop with the box's fence: %v", err)
	}
	before = wantFence(t, b)
	if before.Phase != runtime.PhaseStopped {
		t.Fatalf("got phase %s (%s), want stopped", before.Phase, before.Reason)
	}
	_, err = d.Start(with(t, a), id)
	refused(t, "Start of a stopped box", err)
	unchanged(t, before)
	// A newer holder C starts it; B is the old one now.
	if _, err := d.Start(with(t, c), id); err != nil {
		t.Fatalf("Start with a newer fence: %v", err)
	}
	before = wantFence(t, c)
	if before.Phase != runtime.PhaseRunning {
		t.Fatalf("got phase %s (%s), want running", before.Phase, before.Reason)
	}
	refused(t, "Stop by the previous holder", d.Stop(with(t, b), id))
	unchanged(t, before)
	// Writers with fences above c race: the writes the box takes are in the order of their
	// fences (each checked and stored with its change in one step), and the highest wins.
	type write struct {
		pos   int64 // how many writes the record had counted before this one
		fence uint64
	}
	var (
		mu   sync.Mutex
		took []write
		wg   sync.WaitGroup
	)
	const writers = 12
	for _, i := range rand.Perm(writers) {
		fence := c + 1 + uint64(i)
		wg.Go(func() {
			var pos int64
			_, err := d.UpdateRecord(with(t, fence), id, func(r *runtime.Record) error {
				pos = r.TTLSec // the last call is the one stored
				r.TTLSec++
				return nil
			})
			if errors.Is(err, runtime.ErrFenced) {
				return
			}
			if err != nil {
				t.Errorf("UpdateRecord with fence %d: %v", fence, err)
				return
			}
			mu.Lock()
			took = append(took, write{pos, fence})
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("%d of %d racing writers' writes taken", len(took), writers)
	slices.SortFunc(took, func(x, y write) int { return int(x.pos - y.pos) })
	for i := 1; i < len(took); i++ {
		if took[i].pos == took[i-1].pos || took[i].fence < took[i-1].fence {
			t.Fatalf("writes taken, in order (record count, fence): %v; want distinct counts and rising fences", took)
		}
	}
	after := wantFence(t, c+writers)
	if len(took) == 0 || took[len(took)-1].fence != c+writers || after.Record.TTLSec != before.Record.TTLSec+int64(len(took)) {
		t.Fatalf("writes taken %v, ttl %d from %d: want the highest fence's last and every taken write counted", took, after.Record.TTLSec, before.Record.TTLSec)
	}
	if err := d.Delete(with(t, c+writers), id); err != nil {
		t.Fatalf("Delete with the box's fence: %v", err)
	}
	if _, err := d.Get(ctxT(t), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Get after Delete: got %v, want ErrNotFound", err)
	}
}
