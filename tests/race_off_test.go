//go:build !race

package tests

// raceEnabled says whether this test binary runs with the race detector.
const raceEnabled = false
