package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/tests/e2e"
)

// TestRestartKeepsRedis: sandboxd's default Redis (no REDIS_URL) is a redis-server it runs and
// supervises under the state folder, with an append-only file, so a SIGKILL of sandboxd and a
// start on the same folder forget nothing: the whole output of an exec streamed before, its
// agent run's record, and a sandbox's idle clock, which then auto-stops it on time (not early
// from its create, not late from the restart). Also: the Redis folder and socket are the
// owner's only and out of a sandbox's reach; the redis-server child dies with a SIGKILLed
// sandboxd; and a SIGKILL of the redis-server itself is survived (requests answer 200 or
// UNAVAILABLE meanwhile, it is restarted and counted in /metrics, nothing is lost).
func TestRestartKeepsRedis(t *testing.T) {
	sd := e2e.NewStateDir(t)
	opts := e2e.ServerOptions{State: sd, Limits: map[string]any{"autostop_min_sec": 1},
		Extra: map[string]any{"reconcile_interval_ms": 300, "agents": agentCatalog()}}
	a := e2e.StartServer(t, opts)
	redisDir := filepath.Join(sd.Dir, "redis")

	e2e.Step(t, "embedded-redis-is-private", func(t *testing.T) {
		for _, p := range []string{redisDir, filepath.Join(redisDir, "redis.sock")} {
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("%s: got %v (%v), want mode 0700", p, fi.Mode(), err)
			}
		}
		if m := metric(t, a, "sandboxd_redis_up"); m != 1 {
			t.Errorf("sandboxd_redis_up: got %v, want 1", m)
		}
		if m := metric(t, a, "sandboxd_redis_used_memory_bytes"); m <= 0 {
			t.Errorf("sandboxd_redis_used_memory_bytes: got %v, want > 0", m)
		}
	})

	// idle: autostop 20 s, used once at ~10 s. work: execs and an agent run.
	idle := a.Create(t, `{"profile":"sandboxes-default","autostop_sec":20}`, e2e.HdrTenant1)
	t0 := time.Now()
	a.Track(idle.SandboxID, e2e.HdrTenant1)
	work := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	a.Track(work, e2e.HdrTenant1)

	e2e.Step(t, "sandbox-cannot-reach-redis", func(t *testing.T) {
		out := a.Run(t, work, []string{"sh", "-c", "cat /proc/mounts; ls -la " + redisDir + " 2>&1; ls -la /workspace/.. 2>&1"}, e2e.HdrTenant1)
		if strings.Contains(out, "redis.sock") || strings.Contains(out, sd.Dir+" ") || !strings.Contains(out, "No such file") {
			t.Errorf("inside the sandbox: got %q, want no trace of the state folder's Redis", out)
		}
	})

	var execID, streamed string
	var exitBefore string
	e2e.Step(t, "exec-output-streamed", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c",
			"for i in $(seq 1 40); do echo out-$i; echo err-$i >&2; sleep 0.05; done"}, "wait": false})
		r := a.Curl(t, http.MethodPost, e2e.Prefix+"/"+work+"/exec", []byte(body), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusAccepted)
		var st execStatusFull
		r.Decode(t, &st)
		execID = st.ExecID
		resp := sseRequest(t, a, http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID+"/output", "", e2e.HdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		stdout, stderr := sseOutput(t, evs)
		streamed = stdout + "|" + stderr
		if want := numbered("out", 40) + "|" + numbered("err", 40); streamed != want {
			t.Fatalf("streamed output: got %q, want %q", streamed, want)
		}
		exitBefore = evs[len(evs)-1].data
	})

	var runBefore []byte
	e2e.Step(t, "agent-run-recorded", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"agent_id": "tester", "model": "m", "instruction": "restart me",
			"sandbox_id": work, "config": map[string]any{}})
		run := startRun(t, a, body, e2e.HdrTenant1)
		e2e.Eventually(t, time.Minute, "the agent run to end", func() (bool, string) {
			got := getRun(t, a, run.RunID)
			return got.Status != "RUNNING" && got.Status != "STARTING", got.Status
		})
		r := a.Curl(t, http.MethodGet, agentRuns+"/"+run.RunID, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		runBefore = r.Body
		if !strings.Contains(string(runBefore), `"exit_code":0`) {
			t.Fatalf("agent run: got %s, want it ended with exit 0", runBefore)
		}
	})

	// The idle sandbox is used once, at t0+10 s; then sandboxd is SIGKILLed.
	time.Sleep(time.Until(t0.Add(10 * time.Second)))
	usedFrom := time.Now()
	a.Get(t, idle.SandboxID, e2e.HdrTenant1)
	usedTo := time.Now()
	redisPID := readPID(t, filepath.Join(redisDir, "redis-server.pid"))
	a.Kill(t)
	e2e.Step(t, "redis-server-dies-with-sandboxd", func(t *testing.T) {
		e2e.Eventually(t, 10*time.Second, "the redis-server child to exit", func() (bool, string) {
			return !processAlive(redisPID), fmt.Sprintf("pid %d alive", redisPID)
		})
	})
	b := e2e.StartServer(t, opts)
	b.Track(idle.SandboxID, e2e.HdrTenant1)
	b.Track(work, e2e.HdrTenant1)
	t.Logf("sandboxd restarted %s after the idle sandbox's create", time.Since(t0).Round(10*time.Millisecond))

	e2e.Step(t, "idle-clock-kept", func(t *testing.T) {
		// Through the listing only: a GET would be activity.
		sb, ok := b.ListAll(t, e2e.HdrTenant1).Find(idle.SandboxID)
		if !ok || sb.State != "RUNNING" || sb.AutostopAt == nil {
			t.Fatalf("after the restart: got %+v, want RUNNING with an autostop_at", sb)
		}
		lo, hi := usedFrom.Add(20*time.Second-time.Millisecond), usedTo.Add(20*time.Second+time.Millisecond)
		if sb.AutostopAt.Before(lo) || sb.AutostopAt.After(hi) {
			t.Errorf("autostop_at after the restart: got %s, want the use's (%s..%s) plus 20 s; the create's would be %s",
				sb.AutostopAt.Format(time.RFC3339Nano), lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano),
				t0.Add(20*time.Second).Format(time.RFC3339Nano))
		}
	})

	e2e.Step(t, "exec-output-kept", func(t *testing.T) {
		resp := sseRequest(t, b, http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID+"/output", "", e2e.HdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		stdout, stderr := sseOutput(t, evs)
		if got := stdout + "|" + stderr; got != streamed {
			t.Errorf("output after the restart: got %q, want what was streamed before, %q", got, streamed)
		}
		if len(evs) == 0 || evs[len(evs)-1].event != "exit" || evs[len(evs)-1].data != exitBefore {
			t.Errorf("exit after the restart: got %v, want %s", sseKinds(evs), exitBefore)
		}
		var st execStatusFull
		b.Curl(t, http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || st.ExitCode == nil || *st.ExitCode != 0 || st.Stdout != numbered("out", 40) || st.Stderr != numbered("err", 40) {
			t.Errorf("status after the restart: got %+v, want ENDED, exit 0, the whole output", st)
		}
	})

	e2e.Step(t, "agent-run-kept", func(t *testing.T) {
		var before map[string]any
		if err := json.Unmarshal(runBefore, &before); err != nil {
			t.Fatal(err)
		}
		r := b.Curl(t, http.MethodGet, agentRuns+"/"+before["run_id"].(string), nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		if string(r.Body) != string(runBefore) {
			t.Errorf("agent run after the restart: got %s, want %s", r.Body, runBefore)
		}
	})

	e2e.Step(t, "autostop-on-time", func(t *testing.T) {
		// Still running at t0+25 s (the create's clock would have stopped it at ~t0+20 s),
		// stopped by ~t0+32 s (the use's clock: t0+30 s, plus the reconciler and the stop).
		var stoppedAt time.Time
		for stoppedAt.IsZero() {
			sb, ok := b.ListAll(t, e2e.HdrTenant1).Find(idle.SandboxID)
			if !ok {
				t.Fatalf("the listing lost %s", idle.SandboxID)
			}
			now := time.Now()
			switch {
			case sb.State == "RUNNING":
			case sb.State == "STOPPING" || sb.State == "STOPPED":
				stoppedAt = now
				if now.Before(usedFrom.Add(20 * time.Second)) {
					t.Fatalf("%s at t0+%s, before its last use plus autostop_sec (t0+%s): stopped early",
						sb.State, now.Sub(t0).Round(10*time.Millisecond), usedFrom.Add(20*time.Second).Sub(t0).Round(10*time.Millisecond))
				}
			default:
				t.Fatalf("got state %s (%s), want RUNNING then STOPPING/STOPPED", sb.State, sb.StateReason)
			}
			if now.After(t0.Add(35 * time.Second)) {
				t.Fatalf("still %s at t0+%s, want stopped by ~t0+32 s", sb.State, now.Sub(t0).Round(10*time.Millisecond))
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("auto-stop seen at t0+%s (used at t0+%s, autostop_sec 20)", stoppedAt.Sub(t0).Round(10*time.Millisecond),
			usedFrom.Sub(t0).Round(10*time.Millisecond))
	})

	e2e.Step(t, "redis-server-killed-mid-requests", func(t *testing.T) {
		pid := readPID(t, filepath.Join(redisDir, "redis-server.pid"))
		var mu sync.Mutex
		codes := map[string]int{}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					r, err := b.Send(http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID, nil, e2e.HdrTenant1)
					k := "error"
					if err == nil {
						k = strconv.Itoa(r.Status)
						if r.Status != http.StatusOK {
							k += " " + errorCode(r.Body) + " retry-after=" + r.Header.Get("Retry-After")
						}
					}
					mu.Lock()
					codes[k]++
					mu.Unlock()
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		e2e.Eventually(t, 20*time.Second, "the redis-server to be restarted", func() (bool, string) {
			m := metric(t, b, "sandboxd_redis_restarts_total")
			return m == 1 && metric(t, b, "sandboxd_redis_up") == 1, fmt.Sprintf("restarts %v", m)
		})
		time.Sleep(300 * time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("answers while the redis-server was killed and restarted: %v", codes)
		for k := range codes {
			if k != "200" && k != "503 UNAVAILABLE retry-after=1" {
				t.Errorf("got answer %q, want only 200 or 503 UNAVAILABLE with Retry-After", k)
			}
		}
		if newPID := readPID(t, filepath.Join(redisDir, "redis-server.pid")); newPID == pid {
			t.Errorf("pidfile still names the killed redis-server %d", pid)
		}
		var st execStatusFull
		b.Curl(t, http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || st.Stdout != numbered("out", 40) {
			t.Errorf("status after the redis-server's restart: got %+v, want ENDED with the whole output", st)
		}
		// Another tenant still sees nothing of it.
		r := b.Curl(t, http.MethodGet, e2e.Prefix+"/"+work+"/execs/"+execID, nil, e2e.HdrTenant2)
		r.WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}

// numbered is "<prefix>-1\n" … "<prefix>-n\n".
func numbered(prefix string, n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s-%d\n", prefix, i)
	}
	return b.String()
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("pidfile: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("pidfile %s: got %q", path, b)
	}
	return pid
}

// processAlive reports whether pid runs (a zombie does not count).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// metric reads one unlabelled metric from the server's /metrics (-1 when absent).
func metric(t *testing.T, s *e2e.Server, name string) float64 {
	t.Helper()
	r := s.Curl(t, http.MethodGet, "/metrics", nil)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(r.Body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// errorCode is the code of a REST error body ("" when it has none).
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &e)
	if e.Error.Code != "" {
		return e.Error.Code
	}
	return e.Code
}
