package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// Exec output larger than every bound, end to end on real runsc: the guest init keeps the
// newest 64 MiB of each exec's output, the exec's Redis stream the newest 16 MiB, the waited
// answer the newest limits.exec_max_output_bytes. Every reader gets the newest bytes with an
// explicit TRUNCATED before them, and output_bytes counts exactly what the command wrote.

const (
	// bigWrite bytes of "y", then bigEnd: 150 MB, more than twice the guest log's bound.
	bigWrite = 150_000_000
	bigEnd   = "\nTHE END\n"
	bigTotal = bigWrite + int64(len(bigEnd))
	// outputCap is the waited answer's cap in these tests (limits.exec_max_output_bytes).
	outputCap = 64 << 10
)

var bigCommand = []string{"sh", "-c", fmt.Sprintf(`head -c %d /dev/zero | tr '\000' y; printf '\nTHE END\n'`, bigWrite)}

// bigTail is what the waited answer holds: the newest outputCap bytes.
var bigTail = strings.Repeat("y", outputCap-len(bigEnd)) + bigEnd

// execStatusFull is the REST status of an exec with its output fields.
type execStatusFull struct {
	ExecID          string  `json:"exec_id"`
	State           string  `json:"state"`
	ExitCode        *int    `json:"exit_code"`
	Error           string  `json:"error"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	OutputBytes     *int64  `json:"output_bytes"`
	StartedAt       *string `json:"started_at"`
}

// checkBigStream reads an exec's SSE output from the start and checks it: a truncated event
// first, then only chunks (the newest output, ending with the command's end), the exit last
// with output_bytes = bigTotal; and the log accounting is exact: the missed bytes plus every
// chunk's bytes and 5-byte header reach the exit's offset.
func checkBigStream(t *testing.T, s *e2e.Server, sandboxID, execID string) {
	t.Helper()
	resp := sseRequest(t, s, http.MethodGet, e2e.Prefix+"/"+sandboxID+"/execs/"+execID+"/output", "", e2e.HdrTenant1)
	evs := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(evs) < 3 {
		t.Fatalf("output events: got %v, want truncated, chunks, exit", sseKinds(evs))
	}
	if evs[0].event != "truncated" {
		t.Fatalf("first event: got %s %s, want truncated", evs[0].event, evs[0].data)
	}
	var logBytes int64
	var missed struct {
		MissedBytes int64 `json:"missed_bytes"`
	}
	if err := json.Unmarshal([]byte(evs[0].data), &missed); err != nil || missed.MissedBytes <= 0 {
		t.Fatalf("truncated event: got %s (%v), want missed_bytes > 0", evs[0].data, err)
	}
	logBytes += missed.MissedBytes
	for i, ev := range evs[1 : len(evs)-1] {
		if ev.event != "chunk" {
			t.Fatalf("event %d: got %s, want only chunks between the truncated event and the exit", i+1, ev.event)
		}
	}
	stdout, stderr := sseOutput(t, evs)
	for _, ev := range evs[1 : len(evs)-1] {
		var c struct {
			Data       *string `json:"data"`
			DataBase64 *string `json:"data_base64"`
		}
		_ = json.Unmarshal([]byte(ev.data), &c)
		n := 0
		if c.Data != nil {
			n = len(*c.Data)
		}
		logBytes += int64(5 + n)
	}
	if stderr != "" || !strings.HasSuffix(stdout, "yyyy"+bigEnd) || strings.Trim(stdout[:len(stdout)-len(bigEnd)], "y") != "" {
		t.Errorf("streamed output: %d bytes ending %q, stderr %q; want the newest bytes of the output", len(stdout), tailOf(stdout), stderr)
	}
	if len(stdout) < 8<<20 {
		t.Errorf("streamed output: got %d bytes, want the newest several MiB", len(stdout))
	}
	last := evs[len(evs)-1]
	var exit execStatusFull
	if err := json.Unmarshal([]byte(last.data), &exit); err != nil || last.event != "exit" {
		t.Fatalf("last event: got %s %s (%v), want exit", last.event, last.data, err)
	}
	if exit.State != "ENDED" || exit.ExitCode == nil || *exit.ExitCode != 0 || exit.OutputBytes == nil || *exit.OutputBytes != bigTotal {
		t.Errorf("exit event: got %s, want ENDED, exit 0, output_bytes %d", last.data, bigTotal)
	}
	// The exit's cursor is "<log offset>-1": everything before it was either missed or read.
	off, err := strconv.ParseInt(strings.TrimSuffix(last.id, "-1"), 10, 64)
	if err != nil || off != logBytes {
		t.Errorf("accounting: the exit is at %q, missed + chunks (with headers) = %d; want equal", last.id, logBytes)
	}
}

func tailOf(s string) string { return s[max(0, len(s)-16):] }

// TestExecOutputKeepsTheNewest: a command writes 150 MB (more than the guest log keeps) through
// the waited exec, and through a detached exec that nobody follows while it writes (its
// replica was SIGKILLed; the next one follows on from the guest's log, whose head is gone).
func TestExecOutputKeepsTheNewest(t *testing.T) {
	st := e2e.NewStateDir(t)
	rs := redistest.Start(t) // a Redis that outlives a SIGKILLed replica
	opts := e2e.ServerOptions{State: st, RedisURL: rs.URL, Limits: map[string]any{"exec_max_output_bytes": outputCap},
		Extra: map[string]any{"reconcile_interval_ms": 300, "execs": map[string]any{"follow_lease_sec": 60}}}
	a := e2e.StartServer(t, opts)
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID

	var execID string
	e2e.Step(t, "waited-answer-holds-the-newest-bytes", func(t *testing.T) {
		body := e2e.MustJSON(t, map[string]any{"command": bigCommand, "timeout_sec": 600})
		start := time.Now()
		res := a.Exec(t, id, body, e2e.HdrTenant1)
		t.Logf("150 MB exec answered in %s", time.Since(start).Round(time.Millisecond))
		execID = res.ExecID
		if res.ExitCode != 0 || res.Error != "" {
			t.Fatalf("exec: got exit %d error %q, want 0", res.ExitCode, res.Error)
		}
		if res.Stdout != bigTail || !res.StdoutTruncated || res.StderrTruncated || res.Stderr != "" {
			t.Errorf("exec: got %d stdout bytes ending %q, truncated %v/%v; want the newest %d bytes, stdout_truncated only",
				len(res.Stdout), tailOf(res.Stdout), res.StdoutTruncated, res.StderrTruncated, outputCap)
		}
	})

	e2e.Step(t, "status-counts-every-byte", func(t *testing.T) {
		var got execStatusFull
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil, e2e.HdrTenant1).Decode(t, &got)
		if got.State != "ENDED" || got.OutputBytes == nil || *got.OutputBytes != bigTotal {
			t.Errorf("status: got state %s output_bytes %v, want ENDED and %d", got.State, got.OutputBytes, bigTotal)
		}
		if got.Stdout != bigTail || !got.StdoutTruncated || got.StderrTruncated {
			t.Errorf("status: got %d stdout bytes ending %q, truncated %v/%v; want the newest %d bytes, stdout_truncated only",
				len(got.Stdout), tailOf(got.Stdout), got.StdoutTruncated, got.StderrTruncated, outputCap)
		}
		var g struct {
			OutputBytes     int64 `json:"outputBytes"`
			StdoutTruncated bool  `json:"stdoutTruncated"`
		}
		a.GQL(t, `query($id: ID!) { exec(id: $id) { outputBytes stdoutTruncated } }`, map[string]any{"id": execID}, e2e.HdrTenant1).OK(t, "exec", &g)
		if g.OutputBytes != bigTotal || !g.StdoutTruncated {
			t.Errorf("GraphQL exec: got %+v, want outputBytes %d and stdoutTruncated", g, bigTotal)
		}
	})

	e2e.Step(t, "stream-truncated-then-newest-then-exit", func(t *testing.T) {
		checkBigStream(t, a, id, execID)
		// GraphQL execOutput: the same order.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		w := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
		var kinds []string
		var tail []byte
		for {
			ev, ok := w.next(ctx)
			if !ok {
				break
			}
			if len(kinds) == 0 || kinds[len(kinds)-1] != ev.Kind {
				kinds = append(kinds, ev.Kind)
			}
			if ev.Kind == "CHUNK" {
				tail = append(tail, chunkBytes(t, ev)...)
				tail = tail[max(0, len(tail)-64):]
			}
		}
		if strings.Join(kinds, ",") != "TRUNCATED,CHUNK,EXIT" || !strings.HasSuffix(string(tail), bigEnd) {
			t.Errorf("execOutput: got %v ending %q, want TRUNCATED, CHUNKs ending with the output's end, EXIT", kinds, tail)
		}
	})

	e2e.Step(t, "follower-killed-while-the-guest-drops-output", func(t *testing.T) {
		// The command writes everything while nobody follows (its replica was SIGKILLed and its
		// lease has not lapsed yet); the next replica follows on from offset 0, which the
		// guest's log no longer keeps.
		// It starts writing only once the new replica says so (big-go), after the kill: a
		// command that wrote at once raced the kill, and the dying replica's follower could copy
		// its first batch before the SIGKILL landed.
		body := e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c",
			"while [ ! -e big-go ]; do sleep 0.05; done; " + bigCommand[2] + "; touch big-done"}, "wait": false})
		r := a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(body), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusAccepted)
		var started execStatusFull
		r.Decode(t, &started)
		a.Kill(t)
		b := e2e.StartServer(t, opts)
		b.Track(id, e2e.HdrTenant1)
		// Through the new replica: wait for the command to be done writing, then check that
		// nothing was copied yet (the lease of the dead replica still holds it off).
		b.Run(t, id, []string{"sh", "-c", "touch big-go; while [ ! -e big-done ]; do sleep 0.1; done"}, e2e.HdrTenant1)
		var got execStatusFull
		r = b.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		r.Decode(t, &got)
		if got.State != "RUNNING" || got.OutputBytes == nil || *got.OutputBytes != 0 {
			t.Fatalf("before the takeover: got state %s output_bytes %v, want RUNNING with nothing copied (make the lease longer?)", got.State, got.OutputBytes)
		}
		e2e.Eventually(t, 3*time.Minute, "the exec to end under the new replica", func() (bool, string) {
			got = execStatusFull{}
			r := b.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID, nil, e2e.HdrTenant1)
			r.Want(t, http.StatusOK)
			r.Decode(t, &got)
			return got.State == "ENDED", fmt.Sprintf("state %s output_bytes %v", got.State, got.OutputBytes)
		})
		if got.ExitCode == nil || *got.ExitCode != 0 || got.Error != "" || got.OutputBytes == nil || *got.OutputBytes != bigTotal {
			t.Fatalf("status: got exit %v error %q output_bytes %v, want 0 and %d", got.ExitCode, got.Error, got.OutputBytes, bigTotal)
		}
		if !got.StdoutTruncated || got.StderrTruncated || got.Stdout != bigTail {
			t.Errorf("status: got %d stdout bytes ending %q, truncated %v/%v", len(got.Stdout), tailOf(got.Stdout), got.StdoutTruncated, got.StderrTruncated)
		}
		checkBigStream(t, b, id, started.ExecID)
	})
}
