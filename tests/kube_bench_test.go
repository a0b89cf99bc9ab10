package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/kubetest"
	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestKubeWarmPoolBench is a bench command, not a test: it runs only with
// SANDBOXD_KUBE_BENCH=N (rounds) and prints a table, asserting nothing about time. On the kube
// runtime it measures, round by round, a REST create + first exec (`true`) of a profile with a
// warm pool (a hit: the pool is full before each) against the same of an identical profile
// without one (cold), through one server on the test cluster:
//
//	SANDBOXD_KUBE_BENCH=20 go test -run TestKubeWarmPoolBench -v ./tests/
func TestKubeWarmPoolBench(t *testing.T) {
	rounds := benchRounds(t, "SANDBOXD_KUBE_BENCH")
	c := kubetest.Require(t)
	_, kubeconfig := c.Gateway(t)
	rs := redistest.Start(t)
	opts := kubeServerOptions(t, kubeconfig, rs.URL, e2e.NewStateDir(t))
	prof := func(name string, pool int) map[string]any {
		return map[string]any{"name": name, "image": kubetest.BaseImage, "image_has_init": true,
			"milli_cpu": 1000, "memory_mb": 512, "disk_mb": 1024, "warm_pool": pool}
	}
	opts.Extra["profiles"] = []map[string]any{prof("warm", 2), prof("cold", 0)}
	opts.Extra["default_profile"] = "warm"
	s := e2e.StartServer(t, opts)
	// The timed requests go through a plain client: the harness's own client checks every
	// exchange against the OpenAPI document, which is no part of what a caller waits for.
	plain := &http.Client{Timeout: time.Minute}
	call := func(method, path, body string, want int) []byte {
		t.Helper()
		req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", e2e.KeyDev)
		req.Header.Set("Content-Type", "application/json")
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s (%v), want %d", method, path, resp.StatusCode, data, err, want)
		}
		return data
	}
	once := func(profile string) (total, create time.Duration) {
		t0 := time.Now()
		var sb e2e.SandboxJSON
		if err := json.Unmarshal(call(http.MethodPost, e2e.Prefix, `{"profile":"`+profile+`"}`, http.StatusCreated), &sb); err != nil {
			t.Fatal(err)
		}
		create = time.Since(t0)
		var res struct {
			ExitCode int `json:"exit_code"`
		}
		if err := json.Unmarshal(call(http.MethodPost, e2e.Prefix+"/"+sb.SandboxID+"/exec", `{"command":["true"]}`, http.StatusOK), &res); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec true: %+v %v", res, err)
		}
		total = time.Since(t0)
		call(http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, "", http.StatusOK)
		return total, create
	}
	var warm, warmCreate, cold []time.Duration
	once("cold") // the first create pays one-time costs (the image's first unpack on the node)
	for range rounds {
		waitPool(t, s, 2)
		hits := claimsOf(t, s, "hit")
		w, wc := once("warm")
		if claimsOf(t, s, "hit") != hits+1 {
			t.Fatalf("the warm create was not a pool hit")
		}
		warm, warmCreate = append(warm, w), append(warmCreate, wc)
		cw, _ := once("cold")
		cold = append(cold, cw)
	}
	for _, d := range [][]time.Duration{warm, warmCreate, cold} {
		slices.Sort(d)
	}
	p50 := func(d []time.Duration) time.Duration { return percentile(d, 0.5) }
	p99 := func(d []time.Duration) time.Duration { return percentile(d, 0.99) }
	ratio := float64(p50(warm)) / float64(p50(cold))
	t.Logf("kube runtime, %d rounds, alternating:\n"+
		"| create → first exec `true` | p50 | p99 | against cold |\n| --- | ---: | ---: | ---: |\n"+
		"| REST create (warm pool hit) + REST exec | %v | %v | %.2f× (%.1f× faster) |\n"+
		"| of which the REST create (warm pool hit) | %v | %v | |\n"+
		"| REST create (cold) + REST exec | %v | %v | (bare) |",
		rounds, p50(warm).Round(10*time.Microsecond), p99(warm).Round(10*time.Microsecond), ratio, 1/ratio,
		p50(warmCreate).Round(10*time.Microsecond), p99(warmCreate).Round(10*time.Microsecond),
		p50(cold).Round(10*time.Microsecond), p99(cold).Round(10*time.Microsecond))
}

// benchRounds is the number of rounds a bench command runs, from the environment variable
// name; without it the bench is skipped (it is no test).
func benchRounds(t *testing.T, name string) int {
	t.Helper()
	rounds := 0
	if _, err := fmt.Sscan(os.Getenv(name), &rounds); err != nil || rounds < 1 {
		t.Skipf("a bench: set %s to the number of rounds", name)
	}
	return rounds
}
