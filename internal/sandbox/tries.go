package sandbox

import (
	"sync"
	"time"
)

// tries are the background tries of one chore that the reconciler's passes ask for again and
// again until it is done (storing a pause's memory image, taking the checkpoint a stop owes):
// at most one try of a key runs at a time on this replica, and a key whose last try failed is
// not tried again before retry has passed.
type tries struct {
	retry   time.Duration
	running sync.Map // key → struct{}
	failed  sync.Map // key → the time of its last failure
}

// begin reports whether a try of key may start now, and marks it running when it may; end
// unmarks it.
func (t *tries) begin(key string, now time.Time) bool {
	if at, ok := t.failed.Load(key); ok && now.Sub(at.(time.Time)) < t.retry {
		return false
	}
	_, busy := t.running.LoadOrStore(key, struct{}{})
	return !busy
}

// end ends key's running try.
func (t *tries) end(key string) { t.running.Delete(key) }

// fail notes that key's try failed at now.
func (t *tries) fail(key string, now time.Time) { t.failed.Store(key, now) }

// forget drops key's failure: its try succeeded, or the chore is no longer needed.
func (t *tries) forget(key string) { t.failed.Delete(key) }

// count is how many tries run.
func (t *tries) count() int {
	n := 0
	t.running.Range(func(any, any) bool { n++; return true })
	return n
}
