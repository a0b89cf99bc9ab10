package client

import (
	"testing"
	"time"
)

// SetStartAnswerTimeout shortens a start's bound on the init's answer for one test.
func SetStartAnswerTimeout(t testing.TB, d time.Duration) {
	old := startAnswerTimeout
	startAnswerTimeout = d
	t.Cleanup(func() { startAnswerTimeout = old })
}
