package gvisor

import (
	"context"
	"sync"
	"time"
)

// The containers of paused boxes are deleted in the background (Driver.teardowns, a
// runtime.Jobs keyed by box id).
//
// A `runsc checkpoint` that succeeds ends the box's sandbox and gofer processes once the image
// is written: the box holds no compute from then on. What is left of its container is runsc's
// bookkeeping (`runsc delete`: its state file and lock, the leftover cgroups, the shared
// null-netns mount) and the egress network, about 10–15 ms here, which a pause need not wait
// for. Pause starts it (startTeardown) and returns; destroyContainer, which every later
// operation that creates or deletes the box's container goes through, waits for it first. A
// teardown that fails is only logged: the next destroyContainer runs the same steps again, as
// it does after a crash. At most one runs per box: the caller holds the box's lock, and a pause
// only checkpoints a running box, which no teardown is deleting.
//
// The deletion is held until the pause is recorded: until the box's record is next written
// (UpdateRecord; the caller's write of the paused state), or destroyContainer needs it done,
// or the driver closes, or teardownHold has passed (a caller that never writes). Otherwise
// `runsc delete`, a process start of its own, shares the host's cores and the disk's journal
// with the pause's last steps: on two cores it made the workspace's version (a syncfs) and the
// final record write (an fsync) take 2-4 ms longer each.

// teardownHold is how long a pause's teardown waits for the box's next record write at most.
const teardownHold = time.Second

// startTeardown deletes a checkpointed box's container in the background (teardowns), once
// held no more (teardownGates).
func (d *Driver) startTeardown(id string) {
	gate := d.teardownGates.hold(id)
	wait := d.teardownHold
	d.teardowns.Start(id, func() {
		t := time.NewTimer(wait)
		select {
		case <-gate:
		case <-t.C:
		}
		t.Stop()
		d.teardownGates.releaseGate(id, gate)
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		if err := d.destroyContainerNow(ctx, id); err != nil {
			d.log.Warn("deleting a paused box's container; the next start, resume or delete does it again", "box", id, "err", err)
		}
	})
}

// gates holds, per box, the gate of its held teardown: a channel closed to let it start.
type gates struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// hold makes a new gate for id (releasing the one before, if any) and returns it.
func (g *gates) hold(id string) chan struct{} {
	ch := make(chan struct{})
	g.mu.Lock()
	defer g.mu.Unlock()
	if old := g.m[id]; old != nil {
		close(old)
	}
	if g.m == nil {
		g.m = map[string]chan struct{}{}
	}
	g.m[id] = ch
	return ch
}

// release opens id's gate, if it has one.
func (g *gates) release(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch := g.m[id]; ch != nil {
		close(ch)
		delete(g.m, id)
	}
}

// releaseGate opens id's gate if it is still ch.
func (g *gates) releaseGate(id string, ch chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[id] == ch {
		close(ch)
		delete(g.m, id)
	}
}

// releaseAll opens every gate.
func (g *gates) releaseAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, ch := range g.m {
		close(ch)
		delete(g.m, id)
	}
}
