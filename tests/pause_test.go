package tests

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// Pause and resume end to end, on real runsc: a pause keeps the sandbox's processes, its /tmp
// and the commands running in it, and holds no concurrency slot; a resume brings them back.

// counterLoop writes its pid and a rising count to /tmp/counter (a tmpfs: memory, not the
// workspace) every 50 ms.
const counterLoop = `i=0; while :; do i=$((i+1)); echo "$$ $i" > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.05; done`

// readCounter reads the loop's pid and count (waiting for the loop's first write).
func readCounter(t *testing.T, s *e2e.Server, id, key string) (pid, n int) {
	t.Helper()
	var out string
	e2e.Eventually(t, 20*time.Second, "the counter loop's first write", func() (bool, string) {
		out = s.Run(t, id, []string{"sh", "-c", "cat /tmp/counter 2>/dev/null || true"}, key)
		return out != "", "no /tmp/counter yet"
	})
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("/tmp/counter holds %q", out)
	}
	pid, _ = strconv.Atoi(f[0])
	n, _ = strconv.Atoi(f[1])
	return pid, n
}

// runDetached starts a command with "wait": false and returns its exec id.
func runDetached(t *testing.T, s *e2e.Server, id, key string, argv ...string) string {
	t.Helper()
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(e2e.MustJSON(t, map[string]any{"command": argv, "wait": false})), e2e.HdrJSON, key)
	r.Want(t, http.StatusAccepted)
	var ex struct {
		ExecID string `json:"exec_id"`
	}
	r.Decode(t, &ex)
	return ex.ExecID
}

// pauseVerb posts …/{id}/pause or …/{id}/resume and returns the sandbox.
func pauseVerb(t *testing.T, s *e2e.Server, id, name, key string) e2e.SandboxJSON {
	t.Helper()
	start := time.Now()
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/"+name, nil, key)
	// An answer with Retry-After (503: the pause could not quiesce the box in time on a
	// machine at load 50, and it runs on; 409: a reconciler took the operation over after a
	// lock lease as short as the kill tests set): a client retries, as the answer says.
	retried := false
	for try := 0; try < 5 && r.Status >= 400 && r.Header.Get("Retry-After") != ""; try++ {
		t.Logf("%s answered %s; retrying", name, r)
		time.Sleep(2 * time.Second)
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/"+name, nil, key)
		retried = true
	}
	var sb e2e.SandboxJSON
	if goal := map[string]string{"pause": "PAUSED", "resume": "RUNNING"}[name]; retried && r.Status == http.StatusConflict && goal != "" {
		// The reconciler that took the first call's operation over finished it: the retry
		// finds the sandbox where the call was to bring it, as a client retrying would.
		var e struct {
			Error struct{ Code, State string } `json:"error"`
		}
		r.Decode(t, &e)
		if e.Error.Code == "INVALID_STATE" && e.Error.State == goal {
			sb = s.Get(t, id, key)
			t.Logf("%s was finished by the replica that took it over: %s %q", name, sb.State, sb.StateReason)
			return sb
		}
	}
	r.Want(t, http.StatusOK)
	r.Decode(t, &sb)
	t.Logf("%s took %v: %s %q", name, time.Since(start), sb.State, sb.StateReason)
	return sb
}

func TestPauseKeepsProcesses(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{"quota": map[string]any{"default_limit": 1}}})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	s.Run(t, id, []string{"sh", "-c", "echo kept > kept.txt"}, key)
	runDetached(t, s, id, key, "sh", "-c", counterLoop)
	// A command whose output spans the pause: 80 lines over 8 s.
	lines := runDetached(t, s, id, key, "sh", "-c", `for i in $(seq 1 80); do echo "line-$i"; sleep 0.1; done`)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sub := dialExecOutput(ctx, t, s, e2e.KeyTenant1, lines, "")
	time.Sleep(500 * time.Millisecond)
	pid1, n1 := readCounter(t, s, id, key)

	var paused e2e.SandboxJSON
	e2e.Step(t, "pause", func(t *testing.T) {
		paused = pauseVerb(t, s, id, "pause", key)
		if paused.State != "PAUSED" || paused.LatestSnapshotID == "" {
			t.Fatalf("pause: got %s snapshot %q, want PAUSED with a snapshot", paused.State, paused.LatestSnapshotID)
		}
		if q := s.Quota(t, key); q.InUse != 0 {
			t.Fatalf("quota while PAUSED: in_use %d, want 0", q.InUse)
		}
		if got := s.Get(t, id, key); got.State != "PAUSED" {
			t.Fatalf("get: %s, want PAUSED", got.State)
		}
		// Calls that need a running sandbox are INVALID_STATE, with a hint.
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, key)
		r.WantError(t, http.StatusConflict, "INVALID_STATE", "PAUSED", "resume it first")
		r = s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/files?path=kept.txt", nil, key)
		r.WantError(t, http.StatusConflict, "INVALID_STATE", "PAUSED")
		r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/pause", nil, key)
		r.WantError(t, http.StatusConflict, "INVALID_STATE", "already")
		// Another tenant's sandbox does not exist.
		for _, v := range []string{"pause", "resume"} {
			r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/"+v, nil, e2e.HdrTenant2)
			r.WantError(t, http.StatusNotFound, "NOT_FOUND")
		}
	})

	e2e.Step(t, "resume-takes-a-slot", func(t *testing.T) {
		// The paused sandbox's slot is free: another sandbox takes it, and the resume is 429.
		other := s.Create(t, e2e.CreateBody, key).SandboxID
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/resume", nil, key)
		r.WantError(t, http.StatusTooManyRequests, "QUOTA_EXCEEDED")
		if r.Header.Get("Retry-After") == "" {
			t.Fatalf("a resume refused for quota has no Retry-After: %s", r)
		}
		if got := s.Get(t, id, key); got.State != "PAUSED" {
			t.Fatalf("after a refused resume: %s, want PAUSED", got.State)
		}
		s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+other, nil, key).Want(t, http.StatusOK)
	})

	e2e.Step(t, "resume", func(t *testing.T) {
		resumed := pauseVerb(t, s, id, "resume", key)
		if resumed.State != "RUNNING" || resumed.StateReason != "" {
			t.Fatalf("resume: got %s %q, want RUNNING with nothing to say", resumed.State, resumed.StateReason)
		}
		if q := s.Quota(t, key); q.InUse != 1 {
			t.Fatalf("quota after resume: in_use %d, want 1", q.InUse)
		}
		pid2, n2 := readCounter(t, s, id, key)
		if pid2 != pid1 || n2 < n1 {
			t.Fatalf("after resume the loop is pid %d at %d, want pid %d at %d or more", pid2, n2, pid1, n1)
		}
		e2e.Eventually(t, 10*time.Second, "the loop to count on", func() (bool, string) {
			pid3, n3 := readCounter(t, s, id, key)
			return pid3 == pid1 && n3 > n2, strconv.Itoa(pid3) + " " + strconv.Itoa(n3)
		})
		if out := s.Run(t, id, []string{"cat", "kept.txt"}, key); out != "kept\n" {
			t.Fatalf("workspace after resume: %q", out)
		}
	})

	e2e.Step(t, "exec-output-spans-the-pause", func(t *testing.T) {
		var got []byte
		var exit *int
		for {
			ev, ok := sub.next(ctx)
			if !ok {
				break
			}
			switch ev.Kind {
			case "CHUNK":
				got = append(got, chunkBytes(t, ev)...)
			case "TRUNCATED":
				t.Fatalf("a gap in the output: %+v", ev)
			case "EXIT":
				exit = ev.Result.ExitCode
			}
		}
		if want := numbered("line", 80); string(got) != want {
			t.Fatalf("the subscription got %d bytes %q…, want every line 1..80 (%d bytes)", len(got), head(got), len(want))
		}
		if exit == nil || *exit != 0 {
			t.Fatalf("the exec's end: exit %v, want 0", exit)
		}
	})

	e2e.Step(t, "graphql", func(t *testing.T) {
		var sb struct{ State, AutostopAction string }
		s.GQL(t, `mutation($id: ID!) { pauseSandbox(id: $id) { sandbox { state autostopAction } } }`, map[string]any{"id": id}, key).OK(t, "pauseSandbox.sandbox", &sb)
		if sb.State != "PAUSED" || sb.AutostopAction != "STOP" {
			t.Fatalf("pauseSandbox: %+v", sb)
		}
		s.GQL(t, `mutation($id: ID!) { resumeSandbox(id: $id) { sandbox { state } } }`, map[string]any{"id": id}, key).OK(t, "resumeSandbox.sandbox", &sb)
		if sb.State != "RUNNING" {
			t.Fatalf("resumeSandbox: %+v", sb)
		}
		if pid, _ := readCounter(t, s, id, key); pid != pid1 {
			t.Fatalf("after a GraphQL pause and resume the loop is pid %d, want %d", pid, pid1)
		}
	})
}

func head(b []byte) string {
	if len(b) > 80 {
		return string(b[:80])
	}
	return string(b)
}
