package tests

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestCorruptLogCostsTheServerLittle: a command garbles its own exec's log in the sandbox's
// state folder (it runs as root there) while no replica follows it. The replica that takes the
// exec over meets the same corrupt record at every reopen of the log; it reopens after growing
// pauses, so the tenant's command costs the shared server next to nothing (a tight loop of
// round trips into the box took a core), and the sandbox serves on.
func TestCorruptLogCostsTheServerLittle(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"reconcile_interval_ms": 300,
		"execs":                 map[string]any{"follow_lease_sec": 3},
	}}, 2)
	a, k := reps[0], reps[1]
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	// The first record's header becomes kind 9 with a payload of 4 GiB.
	script := fmt.Sprintf(`sleep 1; head -c 200000 /dev/zero | tr '\000' y; `+
		`printf '\011\377\377\377\377' | dd of=%s/"$%s".log.0 conv=notrunc 2>/dev/null && touch /tmp/garbled; sleep 300`,
		proto.StateDir, proto.ExecIDEnv)
	execDetached(t, k, id, []string{"sh", "-c", script}, e2e.HdrTenant1)
	k.Kill(t) // its follower dies before the command writes
	e2e.Eventually(t, 30*time.Second, "the command garbled its log", func() (bool, string) {
		res := a.Exec(t, id, `{"command":["test","-e","/tmp/garbled"]}`, e2e.HdrTenant1)
		return res.ExitCode == 0, fmt.Sprintf("exit %d", res.ExitCode)
	})
	// The lease (3 s) lapses and A's reconciler takes the exec over; then A's CPU is watched.
	time.Sleep(5 * time.Second)
	pid := strconv.Itoa(a.PID())
	_, before, ok := readProcTicks(pid)
	const watch = 5 * time.Second
	time.Sleep(watch)
	_, after, ok2 := readProcTicks(pid)
	if !ok || !ok2 {
		t.Fatal("could not read the server's CPU time")
	}
	used := time.Duration(after-before) * time.Second / clockTicks
	t.Logf("the server used %v of CPU in %v while following the garbled log", used, watch)
	if used > watch/5 {
		t.Errorf("the server used %v of CPU in %v while following the garbled log, want little", used, watch)
	}
	if res := a.Exec(t, id, `{"command":["echo","still"]}`, e2e.HdrTenant1); res.ExitCode != 0 || res.Stdout != "still\n" {
		t.Errorf("an exec after it: %+v", res)
	}
}
