package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// The live feed end to end: a subscriber on the replica that follows an exec is fed by the
// follower from memory, one on another replica reads Redis; both must see the same events,
// across the follower's death too, and a subscriber that never reads must cost nobody.

// outputEvent is one execOutput event as a client keeps it.
type outputEvent struct {
	cursor, kind, stream string
	data                 []byte
	exitCode             int
}

// readOutput reads w's events to the end of its subscription (or until stop says so, after an
// event), keeping each with its exact bytes.
func readOutput(ctx context.Context, t *testing.T, w *wsExecClient, stop func([]outputEvent) bool) []outputEvent {
	t.Helper()
	var out []outputEvent
	for {
		ev, ok := w.next(ctx)
		if !ok {
			return out
		}
		o := outputEvent{cursor: ev.Cursor, kind: ev.Kind}
		switch ev.Kind {
		case "CHUNK":
			o.stream, o.data = *ev.Stream, chunkBytes(t, ev)
		case "EXIT":
			if ev.Result == nil || ev.Result.ExitCode == nil {
				t.Fatalf("exit event %s without an exit code", ev.Cursor)
			}
			o.exitCode = *ev.Result.ExitCode
		default:
			t.Fatalf("got %s event %s, want chunks and the exit", ev.Kind, ev.Cursor)
		}
		out = append(out, o)
		if stop != nil && stop(out) {
			return out
		}
	}
}

func sameOutput(t *testing.T, what string, a, b []outputEvent) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: got %d and %d events, want the same", what, len(a), len(b))
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.cursor != y.cursor || x.kind != y.kind || x.stream != y.stream || !bytes.Equal(x.data, y.data) || x.exitCode != y.exitCode {
			t.Fatalf("%s: event %d: got %s %s %s (%d bytes) and %s %s %s (%d bytes), want the same", what, i,
				x.cursor, x.kind, x.stream, len(x.data), y.cursor, y.kind, y.stream, len(y.data))
		}
	}
}

func joined(evs []outputEvent, stream string) string {
	var b []byte
	for _, e := range evs {
		if e.stream == stream {
			b = append(b, e.data...)
		}
	}
	return string(b)
}

var outputEventsLine = regexp.MustCompile(`(?m)^sandboxd_exec_output_events_total\{source="(live|redis)"\} (\d+)`)

// outputEvents reads how many output events a server sent from its live window and from Redis.
func outputEvents(t *testing.T, s *e2e.Server) (live, fromRedis int) {
	t.Helper()
	r := s.Curl(t, http.MethodGet, "/metrics", nil)
	for _, m := range outputEventsLine.FindAllSubmatch(r.Body, -1) {
		n, _ := strconv.Atoi(string(m[2]))
		if string(m[1]) == "live" {
			live = n
		} else {
			fromRedis = n
		}
	}
	return live, fromRedis
}

var heapInuseLine = regexp.MustCompile(`(?m)^go_memstats_heap_inuse_bytes ([0-9.e+]+)`)

// heapInuseMiB is a server's Go heap in use, from /metrics.
func heapInuseMiB(t *testing.T, s *e2e.Server) float64 {
	t.Helper()
	m := heapInuseLine.FindSubmatch(s.Curl(t, http.MethodGet, "/metrics", nil).Body)
	if m == nil {
		t.Fatal("no go_memstats_heap_inuse_bytes in /metrics")
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v / (1 << 20)
}

// rssMiB is a process's resident memory.
func rssMiB(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return float64(kb) / 1024
}

func TestExecStreamLiveFeed(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"reconcile_interval_ms": 300,
		// 64 MiB per stream, so that a reader of the 48 MiB below is never truncated.
		"execs": map[string]any{"follow_lease_sec": 3, "stream_max_bytes": 64 << 20},
	}}, 3)
	a, b, k := reps[0], reps[1], reps[2]
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	script := func(n int) []string {
		// stdout and stderr interleaved, with pauses so that subscribers catch up and go live.
		return []string{"sh", "-c", fmt.Sprintf("for i in $(seq 1 %d); do seq $((i*1000)) $((i*1000+999)); echo e$i >&2; sleep 0.02; done; exit 7", n)}
	}
	wantStdout := func(n int) string {
		var s []byte
		for i := 1; i <= n; i++ {
			for j := i * 1000; j <= i*1000+999; j++ {
				s = strconv.AppendInt(s, int64(j), 10)
				s = append(s, '\n')
			}
		}
		return string(s)
	}

	e2e.Step(t, "follower-replica-and-another-see-the-same-events", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		liveBefore, _ := outputEvents(t, a)
		const n = 60
		execID := execDetached(t, a, id, script(n), e2e.HdrTenant1) // a follows it
		local := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
		remote := dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, "")
		done := make(chan []outputEvent, 1)
		go func() {
			var evs []outputEvent
			defer func() { done <- evs }() // also when a check failed in readOutput
			evs = readOutput(ctx, t, remote, nil)
		}()
		got := readOutput(ctx, t, local, nil)
		other := <-done
		sameOutput(t, "subscriber on the follower's replica and on another", got, other)
		if joined(got, "STDOUT") != wantStdout(n) || got[len(got)-1].kind != "EXIT" || got[len(got)-1].exitCode != 7 {
			t.Fatalf("output: %d stdout bytes, last %+v", len(joined(got, "STDOUT")), got[len(got)-1])
		}
		for i := 1; i <= n; i++ {
			if !bytes.Contains([]byte(joined(got, "STDERR")), fmt.Appendf(nil, "e%d\n", i)) {
				t.Fatalf("stderr misses e%d: %q", i, joined(got, "STDERR"))
			}
		}
		// A replay from the start, after the end, through the follower's replica: the same.
		sameOutput(t, "live and replayed", got, readOutput(ctx, t, dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, ""), nil))
		liveAfter, _ := outputEvents(t, a)
		if liveAfter == liveBefore {
			t.Fatalf("the follower's replica sent no event from its live window (%d before and after)", liveBefore)
		}
		t.Logf("%d of %d events on the follower's replica came from its live window", liveAfter-liveBefore, len(got))
		local.c.Close(websocket.StatusNormalClosure, "done")
		remote.c.Close(websocket.StatusNormalClosure, "done")
	})

	e2e.Step(t, "a-fresh-exec-is-fed-from-memory-from-its-first-byte", func(t *testing.T) {
		// curl -N -H 'Accept: text/event-stream' … /exec on the replica that starts (and so
		// follows) the exec: its subscriber waits on the replica's window from the start, and
		// every event (each chunk as its batch goes to Redis, the exit once Redis took it) comes
		// from memory; another replica replays the same events from Redis.
		liveBefore, redisBefore := outputEvents(t, a)
		resp := sseRequest(t, a, http.MethodPost, e2e.Prefix+"/"+id+"/exec",
			`{"command":["sh","-c","sleep 0.5; echo x; sleep 0.2; echo y >&2"]}`, e2e.HdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		if kinds := sseKinds(evs); strings.Join(kinds, ",") != "started,chunk,chunk,exit" {
			t.Fatalf("got events %v, want started, two chunks, exit", kinds)
		}
		if stdout, stderr := sseOutput(t, evs); stdout != "x\n" || stderr != "y\n" {
			t.Fatalf("got stdout %q stderr %q", stdout, stderr)
		}
		liveAfter, redisAfter := outputEvents(t, a)
		if liveAfter-liveBefore != 3 || redisAfter != redisBefore {
			t.Fatalf("events from the live window %d, from Redis %d; want 3 and 0", liveAfter-liveBefore, redisAfter-redisBefore)
		}
		var started execStatusJSON
		if err := json.Unmarshal([]byte(evs[0].data), &started); err != nil {
			t.Fatal(err)
		}
		replay := sseRequest(t, b, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID+"/output", "", e2e.HdrTenant1)
		again := readSSE(t, replay.Body)
		replay.Body.Close()
		if !slices.Equal(again, evs[1:]) {
			t.Fatalf("replayed on another replica: %+v, want %+v", again, evs[1:])
		}
	})

	e2e.Step(t, "follower-killed-mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const n = 150
		execID := execDetached(t, k, id, script(n), e2e.HdrTenant1) // k follows it
		onB := dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, "")
		done := make(chan []outputEvent, 1)
		go func() {
			var evs []outputEvent
			defer func() { done <- evs }()
			evs = readOutput(ctx, t, onB, nil)
		}()
		// A subscriber on k, fed by k's follower, until k dies under it.
		onK := dialExecOutput(ctx, t, k, e2e.KeyTenant1, execID, "")
		got := readOutput(ctx, t, onK, func(evs []outputEvent) bool { return len(joined(evs, "STDOUT")) > 100_000 })
		k.Kill(t)
		// It resumes from its last cursor on a (b's subscriber never stopped).
		rest := readOutput(ctx, t, dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, got[len(got)-1].cursor), nil)
		got = append(got, rest...)
		sameOutput(t, "resumed across the follower's SIGKILL and never interrupted", got, <-done)
		if joined(got, "STDOUT") != wantStdout(n) || got[len(got)-1].exitCode != 7 {
			t.Fatalf("output across the SIGKILL: %d stdout bytes, want %d; last %+v", len(joined(got, "STDOUT")), len(wantStdout(n)), got[len(got)-1])
		}
	})

	e2e.Step(t, "subscribers-that-never-read-on-the-follower", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		beforeG := goroutines(t, a)
		beforeHeap, beforeRSS := heapInuseMiB(t, a), rssMiB(t, a.PID())
		// 48 MiB of output (three times the default stream bound, twelve times the window's).
		const size = 48 << 20
		execID := execDetached(t, a, id, []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size)}, e2e.HdrTenant1)
		stuckWS := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
		stuckSSE := sseRequest(t, a, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID+"/output", "", e2e.HdrTenant1)
		fast := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
		peakHeap, peakRSS := 0.0, 0.0
		nbytes, events := 0, 0
		var exit *execOutputJSON
		for exit == nil {
			ev, ok := fast.next(ctx)
			if !ok {
				t.Fatalf("the fast subscriber's stream completed after %d bytes without the exit", nbytes)
			}
			switch ev.Kind {
			case "CHUNK":
				nbytes += len(chunkBytes(t, ev))
				if events++; events%8 == 0 {
					peakHeap, peakRSS = max(peakHeap, heapInuseMiB(t, a)), max(peakRSS, rssMiB(t, a.PID()))
				}
			case "EXIT":
				exit = &ev
			default:
				t.Fatalf("the fast subscriber got %s after %d bytes", ev.Kind, nbytes)
			}
		}
		if nbytes != size || exit.Result == nil || exit.Result.ExitCode == nil || *exit.Result.ExitCode != 0 {
			t.Fatalf("the fast subscriber got %d bytes and exit %+v, want %d and 0", nbytes, exit.Result, size)
		}
		t.Logf("sandboxd (race build) while %d MiB went to one reader past two that never read: heap in use %.1f → peak %.1f MiB, RSS %.1f → peak %.1f MiB",
			size>>20, beforeHeap, peakHeap, beforeRSS, peakRSS)
		// Holding the output for the two that never read would take twice its size.
		if growth := peakHeap - beforeHeap; growth > 2*float64(size>>20) {
			t.Errorf("sandboxd's heap grew %.1f MiB while two subscribers never read %d MiB of output: want it bounded (below %d)", growth, size>>20, 2*(size>>20))
		}
		b.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		fast.c.Close(websocket.StatusNormalClosure, "done")
		stuckWS.c.CloseNow()
		stuckSSE.Body.Close()
		e2e.Eventually(t, 60*time.Second, "the server's goroutines to return to where they were", func() (bool, string) {
			g := goroutines(t, a)
			return g <= beforeG+5, fmt.Sprintf("%d goroutines, %d before", g, beforeG)
		})
	})
}
