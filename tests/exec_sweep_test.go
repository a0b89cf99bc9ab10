package tests

import (
	"net/http"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// Ended execs' output beyond execs.max_ended_bytes goes within about a second of the exec that
// put it over, not at the reconciler's next sweep (set to a minute here): a burst of large
// outputs does not hold, or fill, Redis meanwhile. The newest execs stay readable.
func TestEndedOutputOverBudgetIsSweptPromptly(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		"reconcile_interval_ms": 60000,
		"execs":                 map[string]any{"stream_max_bytes": 2 << 20, "max_ended_bytes": 4 << 20},
	}})
	key := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, key).SandboxID
	var ids []string
	for range 4 {
		// 1.5 MB each: more than a quarter of the budget, so each end may start a sweep (at
		// most one a second).
		res := s.Exec(t, id, `{"command":["head","-c","1500000","/dev/zero"]}`, key)
		if res.ExitCode != 0 {
			t.Fatalf("exec: %+v", res)
		}
		ids = append(ids, res.ExecID)
		time.Sleep(1100 * time.Millisecond)
	}
	status := func(execID string) int {
		return s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil, key).Status
	}
	// 6 MB ended against a 4 MiB budget: the oldest go, well before the reconciler's sweep.
	e2e.Eventually(t, 5*time.Second, "the oldest exec's output swept", func() (bool, string) {
		st := status(ids[0])
		return st == http.StatusNotFound, http.StatusText(st)
	})
	for _, e := range ids[2:] {
		if st := status(e); st != http.StatusOK {
			t.Fatalf("a newest exec %s: %d, want it kept", e, st)
		}
	}
}
