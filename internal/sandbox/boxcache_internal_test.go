package sandbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"sandboxd/runtime"
	"sandboxd/runtime/runtimetest"
)

// fakeClock is a settable clock for the cache's ages.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func box(id, tenant string) runtime.Box {
	return runtime.Box{Record: runtime.Record{ID: id, Tenant: tenant, Project: "p", State: "RUNNING",
		Labels: map[string]string{"team": "a"}}, Phase: runtime.PhaseRunning}
}

func TestBoxCacheAgeBound(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Second, 10, clk.now)
	gen, at := c.generation()
	c.put(box("a", "t1"), gen, at)
	if _, ok := c.get("a"); !ok {
		t.Fatal("a fresh box: got a miss, want a hit")
	}
	clk.advance(999 * time.Millisecond)
	if _, ok := c.get("a"); !ok {
		t.Fatal("a box 999 ms old with a 1 s bound: got a miss, want a hit")
	}
	clk.advance(time.Millisecond)
	if _, ok := c.get("a"); ok {
		t.Fatal("a box as old as the bound: got a hit, want a miss")
	}
	if n := c.len(); n != 0 {
		t.Fatalf("after an expired read: got %d entries, want 0", n)
	}
}

func TestBoxCacheEntryBound(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Minute, 3, clk.now)
	for i := range 3 {
		gen, at := c.generation()
		c.put(box(fmt.Sprint(i), "t1"), gen, at)
	}
	c.get("0") // 0 is now the most recently used: 1 goes first
	for i := 3; i < 100; i++ {
		gen, at := c.generation()
		c.put(box(fmt.Sprint(i), "t1"), gen, at)
		if n := c.len(); n > 3 {
			t.Fatalf("after %d puts: got %d entries, want at most 3", i+1, n)
		}
		if i == 3 {
			if _, ok := c.get("1"); ok {
				t.Fatal("the least recently used box outlived the bound")
			}
			if _, ok := c.get("0"); !ok {
				t.Fatal("a recently used box was dropped first")
			}
		}
	}
	// The activity notes are bounded by the same count.
	for i := range 100 {
		c.shouldTouch(fmt.Sprint(i), clk.now(), false)
	}
	if n := len(c.touched); n > 3 {
		t.Fatalf("activity notes: got %d, want at most 3", n)
	}
}

// A read that began before a write must not put the old box back after the write dropped it.
func TestBoxCacheReadRacingAWrite(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Minute, 10, clk.now)
	gen, at := c.generation() // a read-through starts
	c.forget("a")             // a write to a lands meanwhile
	c.put(box("a", "t1"), gen, at)
	if _, ok := c.get("a"); ok {
		t.Fatal("a read that raced a write filled the cache")
	}
	gen, at = c.generation()
	c.reset() // a missed-notice reset ends reads under way as well
	c.put(box("a", "t1"), gen, at)
	if _, ok := c.get("a"); ok {
		t.Fatal("a read that raced a reset filled the cache")
	}
}

// What a caller does with a box it was given never changes the cached one.
func TestBoxCacheCopies(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Minute, 10, clk.now)
	b := box("a", "t1")
	b.Record.Spec.NetworkPolicy = &runtime.NetworkPolicy{Mode: "egress", Allow: []string{"10.0.0.0/8"}}
	gen, at := c.generation()
	c.put(b, gen, at)
	b.Record.Labels["team"] = "changed after put"
	got, _ := c.get("a")
	got.Record.Labels["team"] = "changed after get"
	got.Record.Spec.NetworkPolicy.Allow[0] = "0.0.0.0/0"
	again, _ := c.get("a")
	if again.Record.Labels["team"] != "a" || again.Record.Spec.NetworkPolicy.Allow[0] != "10.0.0.0/8" {
		t.Fatalf("the cached box changed: got labels %v allow %v", again.Record.Labels, again.Record.Spec.NetworkPolicy.Allow)
	}
}

func TestBoxCacheTouchCoalesced(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Minute, 10, clk.now)
	t0 := clk.now()
	if !c.shouldTouch("a", t0, false) {
		t.Fatal("first touch: got skipped, want written")
	}
	if c.shouldTouch("a", t0.Add(touchEvery-time.Millisecond), false) {
		t.Fatal("a touch within touchEvery: got written, want skipped")
	}
	if !c.shouldTouch("a", t0.Add(touchEvery), false) {
		t.Fatal("a touch touchEvery later: got skipped, want written")
	}
	c.untouch("a") // its write failed: the next one is written
	if !c.shouldTouch("a", t0.Add(touchEvery), false) {
		t.Fatal("a touch after a failed one: got skipped, want written")
	}
	// An exact touch (a command's end) is written within touchEvery too, and counts as the
	// last write for the coalescing after it.
	t1 := t0.Add(touchEvery + 10*time.Millisecond)
	if !c.shouldTouch("a", t1, true) {
		t.Fatal("an exact touch within touchEvery: got skipped, want written")
	}
	if c.shouldTouch("a", t1.Add(touchEvery-time.Millisecond), false) {
		t.Fatal("a touch within touchEvery of an exact one: got written, want skipped")
	}
}

// Every write through the cached driver drops the box and announces it; a read after it reads
// the runtime again.
func TestCachedDriverWrites(t *testing.T) {
	ctx := context.Background()
	fake := runtimetest.NewFakeT(t)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Hour, 10, clk.now)
	var announced []string
	d := withCache(fake, c, func(id string) { announced = append(announced, id) })
	rec := runtime.Record{ID: "sbx_cachetest", Tenant: "t1", Project: "p1", State: "RUNNING", DesiredState: "RUNNING",
		Spec: runtime.BoxSpec{Profile: "p"}}
	if err := d.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.(runtime.WorkspaceExporter); ok != isExporter(fake) {
		t.Fatalf("WorkspaceExporter: got %v, want the driver's own %v", ok, isExporter(fake))
	}
	if _, err := d.Get(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name  string
		write func() error
	}{
		{"update", func() error {
			_, err := d.UpdateRecord(ctx, rec.ID, func(r *runtime.Record) error { r.Labels = map[string]string{"v": "2"}; return nil })
			return err
		}},
		{"stop", func() error { return d.Stop(ctx, rec.ID) }},
		{"start", func() error { _, err := d.Start(ctx, rec.ID); return err }},
		{"delete", func() error { return d.Delete(ctx, rec.ID) }},
	}
	for _, s := range steps {
		if _, ok := c.get(rec.ID); !ok && s.name != "update" {
			t.Fatalf("%s: the box was not cached before the write", s.name)
		}
		before := len(announced)
		if err := s.write(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if _, ok := c.get(rec.ID); ok {
			t.Fatalf("%s: the box is still cached after the write", s.name)
		}
		if len(announced) != before+1 || announced[len(announced)-1] != rec.ID {
			t.Fatalf("%s: announced %v, want one more notice for %s", s.name, announced, rec.ID)
		}
		got, err := d.Get(ctx, rec.ID)
		switch s.name {
		case "update":
			if err != nil || got.Record.Labels["v"] != "2" {
				t.Fatalf("read after the update: got %v %v, want label v=2", got.Record.Labels, err)
			}
		case "stop":
			if err != nil || got.Phase == runtime.PhaseRunning {
				t.Fatalf("read after the stop: got phase %s %v, want not running", got.Phase, err)
			}
		case "start":
			if err != nil || got.Phase != runtime.PhaseRunning {
				t.Fatalf("read after the start: got phase %s %v, want running", got.Phase, err)
			}
		case "delete":
			if err == nil {
				t.Fatal("read after the delete: got the box, want not found")
			}
		}
	}
}

func isExporter(d runtime.Driver) bool {
	_, ok := d.(runtime.WorkspaceExporter)
	return ok
}

// The cached driver is a runtime.Pooler when its driver is one; a claim (an UpdatePool that
// clears Pool) drops and announces the box, so the next read sees the new sandbox, and a pool
// box is never cached as a sandbox before it.
func TestCachedDriverPooler(t *testing.T) {
	ctx := context.Background()
	fake := runtimetest.NewFakeT(t)
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c := newBoxCache(time.Hour, 10, clk.now)
	var announced []string
	d := withCache(fake, c, func(id string) { announced = append(announced, id) })
	pl, ok := d.(runtime.Pooler)
	if !ok {
		t.Fatal("the cached driver of a Pooler: got no runtime.Pooler, want one")
	}
	if _, ok := withCache(noPool{fake}, c, nil).(runtime.Pooler); ok {
		t.Fatal("the cached driver of a driver without pools: got a runtime.Pooler, want none")
	}
	rec := runtime.Record{ID: "sbx_pooltest", Pool: "default", State: "RUNNING", DesiredState: "RUNNING",
		Spec: runtime.BoxSpec{Profile: "default"}}
	if err := d.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Get(ctx, rec.ID); err == nil {
		t.Fatal("Get of a pool box: got a box, want not found")
	}
	if _, hit := c.get(rec.ID); hit || c.len() != 0 {
		t.Fatalf("after a Get of a pool box: %d cached, want none", c.len())
	}
	boxes, err := pl.ListPool(ctx)
	if err != nil || len(boxes) != 1 {
		t.Fatalf("ListPool: got %d boxes, %v, want 1", len(boxes), err)
	}
	if c.len() != 0 {
		t.Fatalf("after ListPool: %d cached, want none", c.len())
	}
	before := len(announced)
	if _, err := pl.UpdatePool(ctx, rec.ID, func(r *runtime.Record) error {
		r.Pool, r.Tenant, r.Project = "", "t1", "p1"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(announced) != before+1 || announced[len(announced)-1] != rec.ID {
		t.Fatalf("claim: announced %v, want one more notice for %s", announced, rec.ID)
	}
	got, err := d.Get(ctx, rec.ID)
	if err != nil || got.Record.Tenant != "t1" {
		t.Fatalf("Get after the claim: got tenant %q, %v, want t1", got.Record.Tenant, err)
	}
	if _, hit := c.get(rec.ID); !hit {
		t.Fatal("the claimed box was not cached by its Get")
	}
}

// noPool hides the Fake's Pooler.
type noPool struct{ runtime.Driver }
