package tests

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestEndedExecsLeaveTheGuest: once an exec's exit is stored, the sandbox's init forgets the
// exec within seconds (the control plane releases it): its log leaves the init's state folder,
// a tmpfs that the sandbox's memory counts, 8 MiB of ended output included, and its output is
// still served from the stream. A command that left a process behind is kept, and the process
// runs on.
func TestEndedExecsLeaveTheGuest(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	var released []string
	for range 10 {
		released = append(released, s.Exec(t, id, `{"command":["true"]}`, key).ExecID)
	}
	big := s.Exec(t, id, `{"command":["head","-c","8388608","/dev/zero"],"timeout_sec":60}`, key)
	if big.ExitCode != 0 {
		t.Fatalf("8 MiB exec: %+v", big)
	}
	released = append(released, big.ExecID)
	failed := s.Exec(t, id, `{"command":["no-such-program-release"]}`, key)
	if failed.ExitCode != 127 {
		t.Fatalf("a command that cannot start: exit %d, want 127", failed.ExitCode)
	}
	released = append(released, failed.ExecID)
	bg := s.Exec(t, id, `{"command":["sh","-c","sleep 600 >/dev/null 2>&1 & echo $!"]}`, key)
	pid := strings.TrimSpace(bg.Stdout)
	if bg.ExitCode != 0 || pid == "" {
		t.Fatalf("the command that leaves a process behind: %+v", bg)
	}

	// kept lists the execs whose log files the init's state folder holds (hidden from the box's
	// commands: read as the host can).
	kept := func() (ids []string, kib int) {
		out := e2e.RunOverExecLogs(t, s.State.Dir, id, `ls /run/sbx/execs; echo "du $(du -sk /run/sbx/execs | cut -f1)"`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if k, ok := strings.CutPrefix(line, "du "); ok {
				kib, _ = strconv.Atoi(k)
				continue
			}
			if name, _, ok := strings.Cut(line, ".log."); ok && !slices.Contains(ids, name) {
				ids = append(ids, name)
			}
		}
		return ids, kib
	}
	var ids []string
	var size int
	// The releases go every 2 s; the bound is for a loaded machine (each listing is a runsc exec).
	polled := time.Now()
	for deadline := polled.Add(60 * time.Second); ; {
		ids, size = kept()
		left := 0
		for _, x := range released {
			if slices.Contains(ids, x) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s the init still keeps %d of the %d ended execs (%d KiB in its state folder): %v", left, len(released), size, ids)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !slices.Contains(ids, bg.ExecID) {
		t.Fatalf("the exec that left a process behind was forgotten: the init keeps %v", ids)
	}
	// What is left: the kept exec's log and the newest ones' (not released yet).
	if len(ids) > 6 || size > 1024 {
		t.Fatalf("the init keeps the logs of %d execs, %d KiB: %v", len(ids), size, ids)
	}
	t.Logf("the init's state folder %v after the last exec: %d execs, %d KiB", time.Since(polled).Round(time.Millisecond), len(ids), size)
	if out := s.Run(t, id, []string{"sh", "-c", "kill -0 " + pid + " && echo alive"}, key); out != "alive\n" {
		t.Fatalf("the process the kept exec left behind: %q, want alive", out)
	}

	// The released execs answer from the stream as before: status, and the whole output.
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+big.ExecID, nil, key)
	r.Want(t, http.StatusOK)
	var st struct {
		State    string `json:"state"`
		ExitCode int    `json:"exit_code"`
	}
	r.Decode(t, &st)
	if st.State != "ENDED" || st.ExitCode != 0 {
		t.Fatalf("a released exec's status: %s", r)
	}
	out := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+big.ExecID+"/output", nil, key)
	out.Want(t, http.StatusOK)
	if !strings.Contains(string(out.Body), "event: exit") || len(out.Body) < 8<<20 {
		t.Fatalf("a released exec's output replayed: %d bytes, want its 8 MiB and its exit event", len(out.Body))
	}

	if got := s.Get(t, id, key); got.State != "RUNNING" {
		t.Fatalf("the sandbox: %s %q, want RUNNING", got.State, got.StateReason)
	}
}
