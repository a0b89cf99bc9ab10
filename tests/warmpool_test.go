package tests

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/guest/proto"
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

// concurrentWarmCreates makes n creates of profile "warm" at once, the even ones through a and
// the odd ones through b, create i as hdrOf(i) with env WHO=c<i>, and returns their sandbox ids:
// no two the same, every create counted as a pool hit or miss, at least 3 hits.
func concurrentWarmCreates(t *testing.T, a, b *e2e.Server, n int, hdrOf func(int) string) []string {
	t.Helper()
	ids := make([]string, n)
	ms := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		s := []*e2e.Server{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			ids[i] = s.Create(t, fmt.Sprintf(`{"profile":"warm","env":{"WHO":"c%d"}}`, i), hdrOf(i)).SandboxID
			ms[i] = time.Since(t0)
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
	return ids
}

// wantFreshWarm checks that warm sandbox id (created with env WHO=who, from profile "warm",
// whose env has PROFILE_VAR=p) starts empty: the caller's env and the profile's, no file in
// /workspace or /tmp, no process but the guest init's (and on Kubernetes the runtime's attach
// relays, /.sbx/connect) and the check's own; then it leaves
// files and a process behind that no later claim may see.
func wantFreshWarm(t *testing.T, s *e2e.Server, id, who, hdr string) {
	t.Helper()
	out := s.Run(t, id, []string{"sh", "-c",
		`echo "$WHO|$PROFILE_VAR"; ls -A /workspace | wc -l; ls -A /tmp | wc -l; ` +
			`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -c -v -e '^$' -e '/.sbx/init' -e '^/.sbx/connect' -e '^sandbox-spawn $' -e 'sh -c' -e '^tr' -e '^grep' || true`}, hdr)
	if want := who + "|p\n0\n0\n0\n"; out != want {
		t.Fatalf("sandbox %s: got %q, want %q (env, /workspace and /tmp entries, other processes)", id, out, want)
	}
	s.Run(t, id, []string{"sh", "-c", "echo secret > /workspace/mine; echo x > /tmp/mine; (sleep 600 &) "}, hdr)
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
	hdrOf := func(i int) string {
		if i >= 6 {
			return e2e.HdrTenant2
		}
		return e2e.HdrTenant1
	}
	ids := concurrentWarmCreates(t, a, b, n, hdrOf)

	t.Log("every sandbox starts empty, with its own caller's env")
	for i, id := range ids {
		wantFreshWarm(t, b, id, fmt.Sprintf("c%d", i), hdrOf(i))
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

// TestWarmPoolHostileWorkload: a workload in a sandbox claimed from a pool looks for the other
// pool boxes (still waiting to be claimed) and finds no way to them: no socket of another box's
// guest init, none of their host folders, no process of theirs; a stale entry of the pool index
// (a box gone) is skipped and removed, the quota counts the claimed sandboxes exactly.
func TestWarmPoolHostileWorkload(t *testing.T) {
	opts := e2e.ServerOptions{Extra: map[string]any{"profiles": []map[string]any{warmProfile(2)}}}
	opts.State = e2e.NewStateDir(t)
	s := e2e.StartServer(t, opts)
	waitPool(t, s, 2)
	index := filepath.Join(opts.State.Dir, "pool")
	pooled := func() []string {
		entries, err := os.ReadDir(index)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.Name())
		}
		return ids
	}
	before := pooled()
	if len(before) != 2 {
		t.Fatalf("pool index: got %v, want the 2 pool boxes", before)
	}
	// A stale entry: a box that is gone (a replica killed between a delete and the index).
	stale := "sbx_01KZZZZZZZZZZZZZZZZZZZZZZZ"
	if err := os.WriteFile(filepath.Join(index, stale), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	sb := s.Create(t, `{"profile":"warm","env":{"WHO":"hostile"}}`, e2e.HdrTenant1)
	if claimsOf(t, s, "hit") != 1 {
		t.Fatalf("the create was no warm hit (misses %d)", claimsOf(t, s, "miss"))
	}
	if !slices.Contains(before, sb.SandboxID) {
		t.Fatalf("the sandbox %s is none of the pool's boxes %v", sb.SandboxID, before)
	}
	others := slices.DeleteFunc(slices.Clone(before), func(id string) bool { return id == sb.SandboxID })
	waitPool(t, s, 2)
	e2e.Eventually(t, 30*time.Second, "the stale index entry to go", func() (bool, string) {
		ids := pooled()
		return !slices.Contains(ids, stale) && !slices.Contains(ids, sb.SandboxID), fmt.Sprint(ids)
	})
	if q := s.Quota(t, e2e.HdrTenant1); q.InUse != 1 {
		t.Fatalf("quota: got %d in use, want 1 (the claimed sandbox; pool boxes count for nobody)", q.InUse)
	}

	// Nothing of the box's warm-up (a command every pool box runs before it is ready) is left
	// for its claimer: no exec listed, nothing in the guest init's (hidden) exec folder, and no
	// process in the box but the init, its spawner program and the claimer's first command.
	var list struct {
		Execs []struct {
			ExecID string `json:"exec_id"`
		} `json:"execs"`
	}
	s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sb.SandboxID+"/execs", nil, e2e.HdrTenant1).Decode(t, &list)
	if len(list.Execs) != 0 {
		t.Fatalf("execs of a freshly claimed sandbox: got %+v, want none", list.Execs)
	}
	if logs := e2e.RunOverExecLogs(t, opts.State.Dir, sb.SandboxID, "ls -A "+proto.StateDir); logs != "" {
		t.Fatalf("the init's exec folder of a freshly claimed sandbox holds %q, want nothing", logs)
	}
	first := s.Run(t, sb.SandboxID, []string{"sh", "-c", `echo procs:; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -v -e '^/.sbx/init ' -e '^sandbox-spawn $' -e '^sh -c ' -e '^tr ' -e '^grep ' -e '^$'; ` +
		`echo workspace:; ls -A /workspace; echo end`}, e2e.HdrTenant1)
	if first != "procs:\nworkspace:\nend\n" {
		t.Fatalf("the claimer's first command found traces of the warm-up:\n%s", first)
	}
	s.Curl(t, http.MethodGet, e2e.Prefix+"/"+sb.SandboxID+"/execs", nil, e2e.HdrTenant1).Decode(t, &list)
	if len(list.Execs) != 1 {
		t.Fatalf("execs after the claimer's first: got %+v, want its one", list.Execs)
	}

	// What a hostile workload tries: every socket it can find, the host paths of the other
	// boxes, the runtime's folders, the processes it can see.
	var paths []string
	for _, id := range append(others, pooled()...) {
		for _, p := range []string{opts.State.Dir, filepath.Join(opts.State.Dir, "boxes", id), filepath.Join(opts.State.Dir, "boxes", id, "host")} {
			paths = append(paths, p)
		}
	}
	script := `echo sockets:; find / \( -path /proc -o -path /sys \) -prune -o -type s -print 2>/dev/null; ` +
		`echo host:; ls -A /run/sbx/host; ` +
		`echo paths:; for p in ` + strings.Join(paths, " ") + `; do test -e "$p" && echo "$p"; done; ` +
		`echo unix:; tail -n +2 /proc/net/unix | awk '{print $NF}' | grep / | sort -u; ` +
		`echo connect:; for p in $(tail -n +2 /proc/net/unix | awk '{print $NF}' | grep / | sort -u) ` + strings.Join(paths, " ") + `; do ` +
		`python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1]); print("connected", sys.argv[1])
except OSError as e:
    print(e.errno)' "$p"; done | sort | uniq -c | awk '{print $1, $2, $3}'; ` +
		`echo inits:; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -c '^/.sbx/init '; ` +
		`echo end`
	out := s.Run(t, sb.SandboxID, []string{"sh", "-c", script}, e2e.HdrTenant1)
	t.Logf("what the workload found:\n%s", out)
	// No socket file anywhere; its own host socket's folder is an empty read-only folder (the
	// init hid it); none of the runtime's or other boxes' host paths exist in the box; the one
	// path-bound socket it can see is its own init's (which it cannot reach by that path: the
	// connect fails with ENOENT, 2), and every other box's paths fail alike; the one guest
	// init among its processes is its own.
	want := fmt.Sprintf("sockets:\nhost:\npaths:\nunix:\n/run/sbx/host/init.sock\nconnect:\n%d 2 \ninits:\n1\nend\n", len(paths)+1)
	if out != want {
		t.Fatalf("a claimed box's workload found its way toward other boxes:\ngot  %q\nwant %q", out, want)
	}
	// The other boxes were in the pool all along (the workload looked for live ones).
	for _, id := range others {
		if !slices.Contains(pooled(), id) {
			t.Fatalf("the other pool box %s left the pool during the test", id)
		}
	}
	s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	s.Stop(t)
}
