package tests

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// warmProfile is a profile with a warm pool of n boxes per replica.
func warmProfile(n int) map[string]any {
	return map[string]any{"name": "warm", "description": "a warm pool", "rootfs": e2e.Rootfs(),
		"milli_cpu": 1000, "memory_mb": 256, "warm_pool": n, "env": map[string]string{"PROFILE_VAR": "p"}}
}

// poolGauge reads sandboxd_warm_pool_boxes{profile="warm",state} from a server's /metrics.
func poolGauge(t *testing.T, s *e2e.Server, state string) int {
	t.Helper()
	r := s.Curl(t, http.MethodGet, "/metrics", nil)
	r.Want(t, http.StatusOK)
	want := `sandboxd_warm_pool_boxes{profile="warm",state="` + state + `"} `
	sc := bufio.NewScanner(strings.NewReader(string(r.Body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s%s: %v", want, v, err)
			}
			return int(n)
		}
	}
	return -1
}

// waitPool waits until s reports want ready boxes of the warm pool (every replica's).
func waitPool(t *testing.T, s *e2e.Server, want int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		got := poolGauge(t, s, "ready")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready warm boxes: got %d, want %d", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// claimsOf reads sandboxd_warm_pool_claims_total{profile="warm",result}.
func claimsOf(t *testing.T, s *e2e.Server, result string) int {
	t.Helper()
	r := s.Curl(t, http.MethodGet, "/metrics", nil)
	want := `sandboxd_warm_pool_claims_total{profile="warm",result="` + result + `"} `
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// TestWarmPoolAcrossReplicas: two replicas on one state folder and one Redis, each keeping a
// pool of 3, take concurrent creates: no box is handed out twice, every warm sandbox starts
// empty with its own caller's env, the pool boxes hold nobody's slot, a replica killed with
// SIGKILL leaves boxes that the next replica adopts or removes, and at the end nothing is left
// (runsc containers, mounts, loop devices: NewStateDir checks; the owners' locks in Redis).
func TestWarmPoolAcrossReplicas(t *testing.T) {
	rs := redistest.Start(t)
	opts := e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"profiles": []map[string]any{warmProfile(3)},
		"quota":    map[string]any{"default_limit": 9},
	}}
	opts.State = e2e.NewStateDir(t)
	a, b := e2e.StartServer(t, opts), e2e.StartServer(t, opts)
	waitPool(t, a, 6)

	t.Log("pool boxes hold no slot and are no sandboxes")
	if q := b.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Fatalf("quota with 6 warm boxes: got %d in use, want 0", q.InUse)
	}
	if l := a.ListAll(t, e2e.HdrTenant1); len(l.Sandboxes) != 0 {
		t.Fatalf("list with only warm boxes: got %d sandboxes, want 0", len(l.Sandboxes))
	}

	t.Log("8 concurrent creates from both replicas")
	const n = 8
	ids := make([]string, n)
	ms := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		s, hdr := a, e2e.HdrTenant1
		if i%2 == 1 {
			s = b
		}
		if i >= 6 {
			hdr = e2e.HdrTenant2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			sb := s.Create(t, fmt.Sprintf(`{"profile":"warm","env":{"WHO":"c%d"}}`, i), hdr)
			ms[i] = time.Since(t0)
			ids[i] = sb.SandboxID
		}()
	}
	wg.Wait()
	t.Logf("create times: %v", ms)
	seen := map[string]int{}
	for i, id := range ids {
		if j, dup := seen[id]; dup {
			t.Fatalf("creates %d and %d got the same sandbox %s", j, i, id)
		}
		seen[id] = i
	}
	hits := claimsOf(t, a, "hit") + claimsOf(t, b, "hit")
	misses := claimsOf(t, a, "miss") + claimsOf(t, b, "miss")
	t.Logf("warm hits %d, misses %d", hits, misses)
	if hits+misses != n || hits < 3 {
		t.Fatalf("claims: got %d hits and %d misses, want %d creates with at least 3 hits", hits, misses, n)
	}

	t.Log("every sandbox starts empty, with its own caller's env")
	for i, id := range ids {
		s, hdr := b, e2e.HdrTenant1
		if i >= 6 {
			hdr = e2e.HdrTenant2
		}
		out := s.Run(t, id, []string{"sh", "-c",
			`echo "$WHO|$PROFILE_VAR"; ls -A /workspace | wc -l; ls -A /tmp | wc -l; ` +
				`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -c -v -e '^$' -e '/.sbx/init' -e 'sh -c' -e '^tr' -e '^grep' || true`}, hdr)
		if want := fmt.Sprintf("c%d|p\n0\n0\n0\n", i); out != want {
			t.Fatalf("sandbox %d (%s): got %q, want %q (env, /workspace and /tmp entries, other processes)", i, id, out, want)
		}
		// Leave something behind that a later claim must never see.
		s.Run(t, id, []string{"sh", "-c", "echo secret > /workspace/mine; echo x > /tmp/mine; (sleep 600 &) "}, hdr)
	}
	// Another tenant's sandbox does not exist for you.
	a.Curl(t, http.MethodGet, e2e.Prefix+"/"+ids[7], nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	if q := a.Quota(t, e2e.HdrTenant1); q.InUse != 6 {
		t.Fatalf("quota: got %d in use, want 6 (the pool's boxes count for nobody)", q.InUse)
	}

	t.Log("SIGKILL a replica; a new one adopts or removes its boxes")
	waitPool(t, a, 6)
	a.Kill(t)
	c := e2e.StartServer(t, opts)
	// c adopts a's 3 ready boxes (or retires them and fills), b keeps its own: 6 in all again.
	waitPool(t, c, 6)
	// a's owner lock goes once it lapses and c's pass has dealt with a's boxes: then only b's
	// and c's are held (c may reach 6 by filling before a's lock lapses).
	e2e.Eventually(t, 2*time.Minute, "the killed replica's owner lock to go (lock_ttl_sec, 30 s)", func() (bool, string) {
		keys, err := rs.Client.Keys(t.Context(), "*pool-owner*").Result()
		return err == nil && len(keys) == 2, fmt.Sprintf("%v %v", keys, err)
	})
	waitPool(t, c, 6)
	sb := c.Create(t, `{"profile":"warm","env":{"WHO":"after"}}`, e2e.HdrTenant1)
	if out := c.Run(t, sb.SandboxID, []string{"sh", "-c", `echo "$WHO"; ls -A /workspace /tmp | grep -c mine || true`}, e2e.HdrTenant1); out != "after\n0\n" {
		t.Fatalf("a create after the kill: got %q, want the new caller's env and no file of an earlier claim", out)
	}
	// Every sandbox is destroyed (through c: a is gone), then both replicas stop: they retire
	// their pools, and nothing is left (NewStateDir checks runsc, mounts and loop devices).
	for i, id := range append(ids, sb.SandboxID) {
		hdr := e2e.HdrTenant1
		if i >= 6 && i < n {
			hdr = e2e.HdrTenant2
		}
		c.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, hdr).Want(t, http.StatusOK)
	}
	b.Stop(t)
	c.Stop(t)
	keys, err := rs.Client.Keys(t.Context(), "*pool-owner*").Result()
	if err != nil {
		t.Fatalf("redis keys: %v", err)
	}
	if len(keys) != 0 {
		t.Fatalf("pool owner locks left in Redis after every replica stopped: %v", keys)
	}
}
