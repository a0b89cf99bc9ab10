package server

import "time"

// SetSpawnTimeout sets how long a start waits for the spawner program's answer (for the
// servers started afterwards) and returns the function that restores it.
func SetSpawnTimeout(d time.Duration) (restore func()) {
	old := spawnTimeout
	spawnTimeout = d
	return func() { spawnTimeout = old }
}

// SetSpawnerRestartDelay sets the first delay before a spawner program that ended is replaced
// and returns the function that restores it.
func SetSpawnerRestartDelay(d time.Duration) (restore func()) {
	old := spawnerRestartDelay.Swap(int64(d))
	return func() { spawnerRestartDelay.Store(old) }
}

// OpenStreams is how many exec streams the server serves now.
func (s *Server) OpenStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// OpenConns is how many connections the server serves now (exec streams, HTTP/2, and those
// whose first bytes it still waits for).
func (s *Server) OpenConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// HasSparePipes reports whether the next exec's output pipes are made ahead.
func (s *Server) HasSparePipes() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sparePipes != nil
}
