package tests

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// memoryImages lists the data objects of a sandbox's stored memory images in a local
// checkpoint folder (beside its workspace checkpoints, under memory/).
func memoryImages(t *testing.T, st *e2e.StateDir, id string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(st.Checkpoints, "memory", "t1", "p1", id, "*.tar.zst"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// flipByte flips a byte in the middle of a file.
func flipByte(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestResumeWithoutItsMemory: a paused sandbox's memory image is kept twice: by the local
// runtime beside the box (the copy a resume on this host uses when it matches the sums taken
// when it was stored) and in the checkpoint store (compressed, sha256-checked). A resume uses
// whichever copy is intact; a stored copy that is corrupt or truncated is refused with
// CHECKPOINT_CORRUPT, and with no intact copy left the resume falls back to the workspace:
// RUNNING, state_reason "memory not restored: …", the workspace's files there, the processes
// started anew. Never a broken sandbox.
func TestResumeWithoutItsMemory(t *testing.T) {
	st := e2e.NewStateDir(t)
	s := e2e.StartServer(t, e2e.ServerOptions{State: st})
	key := e2e.HdrTenant1
	kept := func(id string) string { return filepath.Join(st.Dir, "boxes", id, "memory") }
	for _, tc := range []struct {
		name string
		harm func(t *testing.T, id string, stored []string)
		// want is what state_reason says; none: the memory was restored.
		want []string
	}{
		{"stored-corrupt", func(t *testing.T, id string, stored []string) {
			flipByte(t, stored[0])
		}, nil},
		{"kept-corrupt", func(t *testing.T, id string, stored []string) {
			flipByte(t, filepath.Join(kept(id), "pages.img"))
		}, nil},
		{"both-corrupt", func(t *testing.T, id string, stored []string) {
			flipByte(t, filepath.Join(kept(id), "pages.img"))
			flipByte(t, stored[0])
		}, []string{"memory not restored", "CHECKPOINT_CORRUPT", "corrupt", "started on its workspace"}},
		{"kept-gone-stored-truncated", func(t *testing.T, id string, stored []string) {
			if err := os.RemoveAll(kept(id)); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(stored[0], 1000); err != nil {
				t.Fatal(err)
			}
		}, []string{"memory not restored", "CHECKPOINT_CORRUPT"}},
		{"both-gone", func(t *testing.T, id string, stored []string) {
			if err := os.RemoveAll(kept(id)); err != nil {
				t.Fatal(err)
			}
			for _, f := range stored {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"memory not restored", "CHECKPOINT_CORRUPT"}},
	} {
		e2e.Step(t, tc.name, func(t *testing.T) {
			id := s.Create(t, e2e.CreateBody, key).SandboxID
			s.Run(t, id, []string{"sh", "-c", "echo kept > kept.txt"}, key)
			runDetached(t, s, id, key, "sh", "-c", counterLoop)
			pid, _ := readCounter(t, s, id, key)
			pauseVerb(t, s, id, "pause", key)
			// The image is stored (and recorded) after the pause's answer; the kept copy's sums
			// are written as it is read.
			e2e.Eventually(t, 30*time.Second, "the memory image to be stored", func() (bool, string) {
				return s.LogContains(`msg="memory image stored" sandbox=` + id), ""
			})
			files := memoryImages(t, st, id)
			if len(files) != 1 {
				t.Fatalf("stored memory images of the paused sandbox: %v, want one", files)
			}
			if _, err := os.Stat(filepath.Join(kept(id), "sums.json")); err != nil {
				t.Fatalf("the runtime's kept copy: %v", err)
			}
			tc.harm(t, id, files)
			sb := pauseVerb(t, s, id, "resume", key)
			if sb.State != "RUNNING" {
				t.Fatalf("resume: %s, want RUNNING", sb.State)
			}
			if out := s.Run(t, id, []string{"cat", "kept.txt"}, key); out != "kept\n" {
				t.Fatalf("the workspace after the resume: %q", out)
			}
			// The stored images are deleted in the background once the sandbox runs.
			e2e.Eventually(t, 30*time.Second, "the stored memory images to be deleted", func() (bool, string) {
				files := memoryImages(t, st, id)
				return len(files) == 0, fmt.Sprint(files)
			})
			if tc.want == nil {
				if sb.StateReason != "" {
					t.Fatalf("state_reason %q, want the memory restored from the intact copy", sb.StateReason)
				}
				if got, _ := readCounter(t, s, id, key); got != pid {
					t.Fatalf("the loop is pid %d, want %d", got, pid)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(sb.StateReason, w) {
					t.Fatalf("state_reason %q, want it to say %q", sb.StateReason, w)
				}
			}
			if got := s.Get(t, id, key); got.StateReason != sb.StateReason {
				t.Fatalf("the sandbox's state_reason later: %q, want %q", got.StateReason, sb.StateReason)
			}
			// The processes did not come back: /tmp is empty.
			r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["test","-e","/tmp/counter"]}`), e2e.HdrJSON, key)
			r.Want(t, http.StatusOK)
			var ex e2e.ExecJSON
			r.Decode(t, &ex)
			if ex.ExitCode == 0 {
				t.Fatal("/tmp/counter exists after a resume without memory")
			}
		})
	}
}

// TestAutoPauseAndAutoResume: a sandbox created with "autostop_action": "pause" is paused, not
// stopped, when idle; with "auto_resume": true an exec resumes it, its processes intact.
func TestAutoPauseAndAutoResume(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Limits: map[string]any{"autostop_min_sec": 1},
		Extra: map[string]any{"reconcile_interval_ms": 300}})
	key := e2e.HdrTenant1
	sb := s.Create(t, `{"profile":"sandboxes-default","autostop_sec":2,"autostop_action":"pause","auto_resume":true}`, key)
	var raw map[string]any
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sb.SandboxID, nil, key)
	r.Want(t, http.StatusOK)
	r.Decode(t, &raw)
	if raw["autostop_action"] != "pause" || raw["auto_resume"] != true {
		t.Fatalf("the sandbox's autostop_action and auto_resume: %v, %v", raw["autostop_action"], raw["auto_resume"])
	}
	id := sb.SandboxID
	// The loop in the background of a command that ends at once: no command runs, so the
	// sandbox is idle (a running command would keep it up).
	runDetached(t, s, id, key, "sh", "-c", "("+counterLoop+") </dev/null >/dev/null 2>&1 &")
	time.Sleep(300 * time.Millisecond)
	pid, _ := readCounter(t, s, id, key)
	// Watched through the listing: a get of the sandbox would be activity.
	e2e.Eventually(t, 60*time.Second, "the idle sandbox to be auto-paused", func() (bool, string) {
		got, _ := s.ListAll(t, key).Find(id)
		return got.State == "PAUSED", got.State + " " + got.StateReason
	})
	if got, _ := s.ListAll(t, key).Find(id); !strings.Contains(got.StateReason, "auto-paused") {
		t.Fatalf("state_reason %q, want it to say auto-paused", got.StateReason)
	}
	if q := s.Quota(t, key); q.InUse != 0 {
		t.Fatalf("quota while auto-paused: %d", q.InUse)
	}
	// An exec resumes it first: the loop is the same process.
	if got, _ := readCounter(t, s, id, key); got != pid {
		t.Fatalf("after the auto-resume the loop is pid %d, want %d", got, pid)
	}
	if got := s.Get(t, id, key); got.State != "RUNNING" {
		t.Fatalf("after the exec: %s, want RUNNING", got.State)
	}
	// Without auto_resume, the same call is INVALID_STATE with the hint.
	plain := s.Create(t, `{"profile":"sandboxes-default"}`, key).SandboxID
	pauseVerb(t, s, plain, "pause", key)
	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+plain+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, key).
		WantError(t, http.StatusConflict, "INVALID_STATE", "auto_resume")
	// A bad autostop_action is refused at create.
	s.Curl(t, http.MethodPost, e2e.Prefix, []byte(`{"autostop_action":"hibernate"}`), key).
		WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT", "autostop_action")
}

// TestPauseEgressSandbox: a sandbox with network egress keeps its network across a pause: after
// the resume its processes are the same and its policy holds (an allowed test host answers, a
// denied one does not).
func TestPauseEgressSandbox(t *testing.T) {
	n := netSubnetOctet(7)
	a := e2e.StartNetHost(t, fmt.Sprintf("198.18.%d.0/24", n), []int{2, 5}, nil)
	A2, A5 := a.Addrs[0].String(), a.Addrs[1].String()
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"profiles": networkProfiles([]string{a.Subnet.String()}, []string{A5}),
		"network":  map[string]any{"dns_servers": []string{A2}},
	}})
	key := e2e.HdrTenant1
	id := s.Create(t, `{"profile":"listed"}`, key).SandboxID
	want := map[string]string{A2 + ":80": "nethost " + A2, A5 + ":80": "refused"}
	wantProbes(t, "before the pause", probe(t, s, id, A2+":80", A5+":80"), want)
	runDetached(t, s, id, key, "sh", "-c", counterLoop)
	time.Sleep(300 * time.Millisecond)
	pid, _ := readCounter(t, s, id, key)
	for round := 1; round <= 2; round++ {
		slot := netSlotOf(t, s.State, id)
		pauseVerb(t, s, id, "pause", key)
		if round == 2 {
			// Another box took the /30 the sandbox had: it resumes on another one (runsc
			// replaces the restored stack's addresses and routes with its namespace's).
			if err := os.WriteFile(slot, []byte("taken by the test"), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(slot) })
		}
		sb := pauseVerb(t, s, id, "resume", key)
		if sb.State != "RUNNING" || sb.StateReason != "" {
			t.Fatalf("round %d: resume of an egress sandbox: %s %q, want RUNNING with its memory", round, sb.State, sb.StateReason)
		}
		if got, _ := readCounter(t, s, id, key); got != pid {
			t.Fatalf("round %d: the loop is pid %d, want %d", round, got, pid)
		}
		wantProbes(t, fmt.Sprintf("after resume %d", round), probe(t, s, id, A2+":80", A5+":80"), want)
		if now := netSlotOf(t, s.State, id); round == 2 && now == slot {
			t.Fatalf("the sandbox resumed on the /30 the test took (%s)", slot)
		}
	}
}

// netSlotOf finds the host-wide file that allocates the sandbox's /30 (the local driver's,
// under /run/sandboxd/net-slots: its content names the driver's folder and the box).
func netSlotOf(t *testing.T, st *e2e.StateDir, id string) string {
	t.Helper()
	files, _ := filepath.Glob("/run/sandboxd/net-slots/*/*")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasSuffix(string(b), " "+id) && strings.HasPrefix(string(b), st.Dir) {
			return f
		}
	}
	t.Fatalf("no network slot of %s under /run/sandboxd/net-slots", id)
	return ""
}
