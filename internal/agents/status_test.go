package agents

import (
	"testing"

	"sandboxd/internal/sandbox"
)

func TestRunStatus(t *testing.T) {
	ended := func(code int, sig string, timedOut bool, errText string) *sandbox.ExecResult {
		return &sandbox.ExecResult{State: sandbox.ExecEnded, ExitCode: code, Signal: sig, TimedOut: timedOut, Error: errText}
	}
	running := &sandbox.ExecResult{State: sandbox.ExecRunning}
	for _, tc := range []struct {
		name                          string
		started, cancelled, gone, old bool
		ex                            *sandbox.ExecResult
		want                          sandbox.AgentRunStatus
	}{
		{"queued", false, false, false, false, nil, sandbox.RunQueued},
		{"queued_abandoned", false, false, false, true, nil, sandbox.RunFailed},
		{"cancelled_before_start", false, true, false, false, nil, sandbox.RunCancelled},
		{"running", true, false, false, false, running, sandbox.RunRunning},
		{"cancel_pending", true, true, false, false, running, sandbox.RunRunning},
		{"succeeded", true, false, false, false, ended(0, "", false, ""), sandbox.RunSucceeded},
		{"failed", true, false, false, false, ended(1, "", false, ""), sandbox.RunFailed},
		{"not_found", true, false, false, false, ended(127, "", false, ""), sandbox.RunFailed},
		{"killed", true, false, false, false, ended(-1, "SIGKILL", false, ""), sandbox.RunFailed},
		{"cancelled", true, true, false, false, ended(-1, "SIGKILL", false, ""), sandbox.RunCancelled},
		{"timed_out", true, false, false, false, ended(-1, "SIGKILL", true, ""), sandbox.RunTimedOut},
		{"lost", true, false, false, false, ended(-1, "", false, "the sandbox was stopped"), sandbox.RunFailed},
		{"exec_gone", true, false, true, false, nil, sandbox.RunFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := runStatus(tc.started, tc.cancelled, tc.ex, tc.gone, tc.old)
			if got != tc.want {
				t.Fatalf("got %s (%q), want %s", got, reason, tc.want)
			}
			if got == sandbox.RunFailed && reason == "" {
				t.Fatalf("FAILED without a reason")
			}
		})
	}
}
