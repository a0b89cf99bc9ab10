package execs

import (
	"context"
	"sync"
	"time"

	"sandboxd/guest/proto"
)

// The release of ended execs' guest logs (guest/proto/release.go). Once a follower has put an
// exec's exit into its stream, the stream holds everything the exec will ever answer, and the
// guest init's log of it only takes the box's memory (its state folder is a tmpfs: up to 64 MiB
// of ended output by default) and makes every pause's image larger. The follower hands the
// exec's id to the releaser, which asks each sandbox's init to forget its ended execs in one
// call per releaseEvery. What the init cannot forget (a command that left processes behind)
// it keeps; a sandbox that stopped, paused or does not answer loses nothing but the batch: its
// init keeps those execs within its own bounds, as before.

// releaseEvery is how often the releaser sends what gathered (a variable for tests).
var releaseEvery = 2 * time.Second

// maxReleasePending bounds the ids that wait for a release on one replica; beyond it new ones
// are not released (their guest keeps them within its own bounds).
const maxReleasePending = 100_000

// releaser gathers the ids of ended execs per sandbox.
type releaser struct {
	mu      sync.Mutex
	pending map[string][]string // sandbox id → exec ids
	n       int
}

// add queues one ended exec of sandbox sb.
func (r *releaser) add(sb, execID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n >= maxReleasePending {
		return
	}
	if r.pending == nil {
		r.pending = map[string][]string{}
	}
	r.pending[sb] = append(r.pending[sb], execID)
	r.n++
}

// take returns what gathered and empties it.
func (r *releaser) take() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending
	r.pending, r.n = nil, 0
	return p
}

// releaseLoop sends the gathered ids every releaseEvery until the service closes.
func (s *Service) releaseLoop() {
	defer s.followers.Done()
	t := time.NewTicker(releaseEvery)
	defer t.Stop()
	for {
		select {
		case <-s.bg.Done():
			return
		case <-t.C:
			s.releaseNow()
		}
	}
}

// releaseAtOnce bounds the sandboxes released at the same time: a sandbox that does not
// answer (its PID 1 stopped) holds one place for the call's timeout, not the others' turn.
const releaseAtOnce = 8

// releaseNow asks each sandbox with gathered ids to forget them, and returns once every call
// ended.
func (s *Service) releaseNow() {
	var wg sync.WaitGroup
	places := make(chan struct{}, releaseAtOnce)
	for sb, ids := range s.released.take() {
		select {
		case places <- struct{}{}:
		case <-s.bg.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-places }()
			for len(ids) > 0 {
				batch := ids[:min(len(ids), proto.MaxReleaseIDs)]
				ids = ids[len(batch):]
				if err := s.release(sb, batch); err != nil {
					s.log.Debug("releasing ended execs in the sandbox failed; its init keeps them", "sandbox", sb, "execs", len(batch), "err", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// releaseTimeout bounds one release call (a variable for tests).
var releaseTimeout = 10 * time.Second

// release asks sandbox sb's init to forget the ended execs ids. A failure is not the sandbox's
// (no GuestError): it only leaves the init its copies.
func (s *Service) release(sb string, ids []string) error {
	ctx, cancel := context.WithTimeout(s.bg, releaseTimeout)
	defer cancel()
	g, err := s.sandboxes.Guest(ctx, sb)
	if err != nil {
		return err
	}
	_, err = g.Release(ctx, ids)
	return err
}
