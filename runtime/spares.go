package runtime

import (
	"io"
	"sync"
	"time"
)

// SpareTTL is how long a ready attach is kept for a box's next Attach. The guest init's HTTP/2
// server closes a connection that sends no client preface within 10 s, so an older spare would
// be handed out dead (the first call after a start that sat idle failed with a broken pipe).
const SpareTTL = 5 * time.Second

// Spares keeps, per box, the attach that proved a newly created or started box ready, for the
// box's next Attach, which then costs nothing. A spare not taken within SpareTTL is closed.
// The zero value is ready to use; every method is safe for concurrent use.
type Spares struct {
	// Ended, when set, reports an attach whose stream has ended already: it is never handed out.
	Ended func(io.ReadWriteCloser) bool

	mu sync.Mutex
	m  map[string]spare
}

type spare struct {
	rwc  io.ReadWriteCloser
	made time.Time
}

// Keep stores a ready attach of box id (closing an older one).
func (s *Spares) Keep(id string, rwc io.ReadWriteCloser) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]spare{}
	}
	old, had := s.m[id]
	s.m[id] = spare{rwc: rwc, made: time.Now()}
	s.mu.Unlock()
	if had {
		old.rwc.Close()
	}
	time.AfterFunc(SpareTTL, func() {
		s.mu.Lock()
		sp, ok := s.m[id]
		ok = ok && sp.rwc == rwc
		if ok {
			delete(s.m, id)
		}
		s.mu.Unlock()
		if ok {
			rwc.Close()
		}
	})
}

// Take returns box id's spare attach if it is young and alive, and nil otherwise.
func (s *Spares) Take(id string) io.ReadWriteCloser {
	s.mu.Lock()
	sp, ok := s.m[id]
	delete(s.m, id)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if time.Since(sp.made) > SpareTTL || (s.Ended != nil && s.Ended(sp.rwc)) {
		sp.rwc.Close()
		return nil
	}
	return sp.rwc
}

// Drop closes box id's spare attach, if any (before its compute goes away).
func (s *Spares) Drop(id string) {
	if rwc := s.Take(id); rwc != nil {
		rwc.Close()
	}
}

// CloseAll closes every spare attach.
func (s *Spares) CloseAll() {
	s.mu.Lock()
	m := s.m
	s.m = nil
	s.mu.Unlock()
	for _, sp := range m {
		sp.rwc.Close()
	}
}
