//go:build race

package tests

// raceEnabled says whether this test binary runs with the race detector; sandboxd is then built
// with -race too, so that a data race inside the server fails the test that provoked it.
const raceEnabled = true
