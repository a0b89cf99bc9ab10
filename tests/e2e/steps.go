package e2e

import (
	"testing"
	"time"
)

// Eventually polls f until it reports done, failing the test after timeout with f's last word.
func Eventually(t *testing.T, timeout time.Duration, what string, f func() (done bool, last string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, last := f()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Step runs one step of a flow as a subtest and ends the flow when the step fails.
func Step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		t.FailNow()
	}
}
