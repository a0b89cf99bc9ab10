package gvisor

import (
	"context"
	"sync"
)

// teardowns are the containers of paused boxes being deleted in the background.
//
// A `runsc checkpoint` that succeeds ends the box's sandbox and gofer processes once the image
// is written: the box holds no compute from then on. What is left of its container is runsc's
// bookkeeping (`runsc delete`: its state file and lock, the leftover cgroups, the shared
// null-netns mount) and the egress network, about 10–15 ms here, which a pause need not wait
// for. Pause starts it (startTeardown) and returns; destroyContainer, which every later
// operation that creates or deletes the box's container goes through, waits for it first. A
// teardown that fails is only logged: the next destroyContainer runs the same steps again, as
// it does after a crash.
type teardowns struct {
	mu sync.Mutex
	m  map[string]chan struct{}
	wg sync.WaitGroup
}

// start runs fn in the background as id's teardown. At most one runs per box: the caller holds
// the box's lock, and a pause only checkpoints a running box, which no teardown is deleting.
func (t *teardowns) start(id string, fn func()) {
	done := make(chan struct{})
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[string]chan struct{})
	}
	t.m[id] = done
	t.mu.Unlock()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer func() {
			t.mu.Lock()
			if t.m[id] == done {
				delete(t.m, id)
			}
			t.mu.Unlock()
			close(done)
		}()
		fn()
	}()
}

// pending reports whether id's teardown is still running.
func (t *teardowns) pending(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[id]
	return ok
}

// wait returns once id has no teardown running, or with ctx's error.
func (t *teardowns) wait(ctx context.Context, id string) error {
	t.mu.Lock()
	done, ok := t.m[id]
	t.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startTeardown deletes a checkpointed box's container in the background (teardowns).
func (d *Driver) startTeardown(id string) {
	d.teardowns.start(id, func() {
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		if err := d.destroyContainerNow(ctx, id); err != nil {
			d.log.Warn("deleting a paused box's container; the next start, resume or delete does it again", "box", id, "err", err)
		}
	})
}
