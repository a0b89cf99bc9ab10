package tests

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestKillDuringPauseAndResume: a replica SIGKILLed at points along a pause, and along a
// resume, leaves the sandbox PAUSED with an intact memory image (a resume brings the very
// processes back), RUNNING with its processes, or STOPPED with its workspace: never lost. The
// next replica on the same state (its reconciler finishes what the killed one began) serves it.
func TestKillDuringPauseAndResume(t *testing.T) {
	st := e2e.NewStateDir(t)
	opts := e2e.ServerOptions{State: st, Extra: map[string]any{"lock_ttl_sec": 3, "reconcile_interval_ms": 300}}
	key := e2e.HdrTenant1
	s := e2e.StartServer(t, opts)
	// The delays reach into the pause's steps on this machine: the quiesce, runsc checkpoint,
	// the image's upload and the workspace checkpoint, the release of the box.
	delays := []time.Duration{30 * time.Millisecond, 200 * time.Millisecond, 450 * time.Millisecond, 800 * time.Millisecond, 1300 * time.Millisecond}
	outcomes := map[string]int{}
	var ids []string // the round's sandbox: each new server destroys it at the end if the round did not
	for _, phase := range []string{"pause", "resume"} {
		for _, delay := range delays {
			// Not a subtest: each kill starts the next server, which must outlive the step.
			func() {
				t.Logf("---- kill %v into a %s", delay, phase)
				id := s.Create(t, e2e.CreateBody, key).SandboxID
				ids = append(ids, id)
				s.Run(t, id, []string{"sh", "-c", "echo kept > kept.txt"}, key)
				runDetached(t, s, id, key, "sh", "-c", counterLoop)
				time.Sleep(300 * time.Millisecond)
				pid, _ := readCounter(t, s, id, key)
				if phase == "resume" {
					pauseVerb(t, s, id, "pause", key)
				}
				ctx, cancel := context.WithCancel(context.Background())
				go func() { _, _ = s.SendContext(ctx, http.MethodPost, e2e.Prefix+"/"+id+"/"+phase, nil, key) }()
				time.Sleep(delay)
				s.Kill(t)
				cancel()
				s = e2e.StartServer(t, opts)
				for _, id := range ids {
					s.Track(id, key)
				}
				got := settle(t, s, id, key)
				outcomes[phase+" → "+got.State]++
				t.Logf("killed %v into the %s: %s %q", delay, phase, got.State, got.StateReason)
				notLost(t, s, id, key, got, pid)
				// Checked: destroyed now, so that the rounds' counter loops do not pile up (ten
				// busy sandboxes on two cores slowed each later pause from 1 s to 24 s and then
				// a create past its bound).
				e2e.Eventually(t, 60*time.Second, "the destroy", func() (bool, string) {
					r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, key)
					if (r.Status == http.StatusConflict || r.Status == http.StatusServiceUnavailable) && r.Header.Get("Retry-After") != "" {
						return false, r.String()
					}
					r.Want(t, http.StatusOK)
					return true, ""
				})
				ids = ids[:len(ids)-1]
			}()
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// settle waits until the sandbox is out of every transition (the new replica's reconciler
// finishes the killed one's after its lock's lease) and returns it.
func settle(t *testing.T, s *e2e.Server, id, key string) e2e.SandboxJSON {
	t.Helper()
	var sb e2e.SandboxJSON
	e2e.Eventually(t, 90*time.Second, "the sandbox to settle", func() (bool, string) {
		sb = s.Get(t, id, key)
		switch sb.State {
		case "PAUSED", "RUNNING", "STOPPED":
			return true, ""
		case "FAILED":
			t.Fatalf("the sandbox FAILED: %q", sb.StateReason)
		}
		return false, sb.State
	})
	return sb
}

// notLost checks what a settled sandbox kept: PAUSED, a resume restores its processes (the
// image was intact); RUNNING, its processes are the ones it had; STOPPED, its workspace.
func notLost(t *testing.T, s *e2e.Server, id, key string, sb e2e.SandboxJSON, pid int) {
	t.Helper()
	if sb.State == "PAUSED" {
		// The killed replica's lock may outlive it for its lease: retry while busy.
		e2e.Eventually(t, 30*time.Second, "the resume", func() (bool, string) {
			r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/resume", nil, key)
			if r.Status == http.StatusConflict && r.Header.Get("Retry-After") != "" {
				return false, r.String()
			}
			r.Want(t, http.StatusOK)
			r.Decode(t, &sb)
			return true, ""
		})
		if sb.State != "RUNNING" || sb.StateReason != "" {
			t.Fatalf("resume after the kill: %s %q, want RUNNING with its memory", sb.State, sb.StateReason)
		}
	}
	switch sb.State {
	case "RUNNING":
		if strings.Contains(sb.StateReason, "memory not restored") {
			t.Fatalf("the sandbox runs without its processes: %q", sb.StateReason)
		}
		if got, _ := readCounter(t, s, id, key); got != pid {
			t.Fatalf("the loop is pid %d, want %d: its processes were lost", got, pid)
		}
	case "STOPPED":
		e2e.Eventually(t, 30*time.Second, "the start", func() (bool, string) {
			r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, key)
			if r.Status == http.StatusConflict && r.Header.Get("Retry-After") != "" {
				return false, r.String()
			}
			r.Want(t, http.StatusOK)
			return true, ""
		})
	}
	if out := s.Run(t, id, []string{"cat", "kept.txt"}, key); out != "kept\n" {
		t.Fatalf("the workspace after the kill: kept.txt is %q", out)
	}
}
