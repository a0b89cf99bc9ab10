// Package fairshare bounds how much of a replica's shared pools one tenant:project may hold at
// once. The pools themselves (the subscriptions a replica follows, each holding a Redis
// connection while it waits) are bounded elsewhere by a replica total; a cap per tenant:project
// below that total keeps one tenant at its cap from making another tenant's call fail.
//
// The counts are per replica and in memory: what they count (open streams) lives and dies with
// this process, so there is nothing to rebuild or leak across a crash.
package fairshare

import "sync"

// Limiter counts what each scope holds against a cap per scope.
type Limiter struct {
	perScope int

	mu   sync.Mutex
	held map[string]int
}

// New returns a Limiter allowing perScope holds per scope; perScope <= 0 means no cap.
func New(perScope int) *Limiter {
	return &Limiter{perScope: perScope, held: map[string]int{}}
}

// Cap is the cap per scope (0: none).
func (l *Limiter) Cap() int { return max(l.perScope, 0) }

// Acquire takes one hold for scope. It answers false when the scope holds its cap already;
// otherwise release gives the hold back (once; later calls do nothing).
func (l *Limiter) Acquire(scope string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perScope > 0 && l.held[scope] >= l.perScope {
		return nil, false
	}
	l.held[scope]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.held[scope]--; l.held[scope] <= 0 {
				delete(l.held, scope)
			}
		})
	}, true
}

// Held is what scope holds now.
func (l *Limiter) Held(scope string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[scope]
}
