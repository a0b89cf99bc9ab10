package runtime

import (
	"context"
	"sync"
)

// Jobs runs work in the background per key (a box), for a driver whose operation returns
// before all of its work is done: the local driver's deletion of a paused box's container,
// the kube driver's relabel of a claimed pool box's pod. A job of a key starts once the key's
// previous job has ended, so two never cross, and whatever must come after a key's jobs
// waits for them (Wait). The zero value is ready to use; every method is safe for concurrent
// use.
type Jobs struct {
	mu sync.Mutex
	m  map[string]chan struct{} // the key's latest job, closed when it has ended
	wg sync.WaitGroup
}

// Start runs fn in the background as key's job, after key's job under way, if any.
func (j *Jobs) Start(key string, fn func()) {
	done := make(chan struct{})
	j.mu.Lock()
	prev := j.m[key]
	if j.m == nil {
		j.m = make(map[string]chan struct{})
	}
	j.m[key] = done
	j.mu.Unlock()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer func() {
			j.mu.Lock()
			if j.m[key] == done {
				delete(j.m, key)
			}
			j.mu.Unlock()
			close(done)
		}()
		if prev != nil {
			<-prev
		}
		fn()
	}()
}

// Pending reports whether a job of key is under way.
func (j *Jobs) Pending(key string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.m[key]
	return ok
}

// Wait returns once key has no job under way, or with ctx's error.
func (j *Jobs) Wait(ctx context.Context, key string) error {
	j.mu.Lock()
	done, ok := j.m[key]
	j.mu.Unlock()
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

// WaitAll returns once every job started so far has ended.
func (j *Jobs) WaitAll() { j.wg.Wait() }
