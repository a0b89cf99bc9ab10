package server

import "time"

// SetSpawnTimeout sets how long a start waits for the spawner program's answer (for the
// servers started afterwards) and returns the function that restores it.
func SetSpawnTimeout(d time.Duration) (restore func()) {
	old := spawnTimeout
	spawnTimeout = d
	return func() { spawnTimeout = old }
}
