package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// Exec output streaming end to end: two sandboxd replicas on one real redis-server, real
// gVisor sandboxes, a graphql-transport-ws client on github.com/coder/websocket, and SSE read
// the way curl -N reads it.

const gqlExecDetached = `mutation($id: ID!, $cmd: [String!]!) {
	exec(sandboxId: $id, input: {command: $cmd}, wait: false) { exec { execId sandboxId state exitCode command } } }`

const gqlExecOutputSub = `subscription($exec: ID!, $after: String) { execOutput(execId: $exec, after: $after) {
	cursor kind stream data dataBase64 missedBytes result { execId state exitCode signal timedOut durationMs error } } }`

type execOutputJSON struct {
	Cursor      string  `json:"cursor"`
	Kind        string  `json:"kind"`
	Stream      *string `json:"stream"`
	Data        *string `json:"data"`
	DataBase64  *string `json:"dataBase64"`
	MissedBytes *int64  `json:"missedBytes"`
	Result      *struct {
		ExecID     string  `json:"execId"`
		State      string  `json:"state"`
		ExitCode   *int    `json:"exitCode"`
		Signal     *string `json:"signal"`
		TimedOut   bool    `json:"timedOut"`
		DurationMs *int64  `json:"durationMs"`
		Error      *string `json:"error"`
	} `json:"result"`
}

// wsExecClient is a graphql-transport-ws client following one exec's output.
type wsExecClient struct {
	t *testing.T
	c *websocket.Conn
}

func dialExecOutput(ctx context.Context, t *testing.T, s *e2e.Server, key, execID, after string) *wsExecClient {
	t.Helper()
	c := dialGraphQL(ctx, t, s)
	// One event carries up to 64 KiB of output, as text and as base64: ~200 KiB of JSON.
	c.SetReadLimit(1 << 20)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": key})})
	if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
	}
	vars := map[string]any{"exec": execID}
	if after != "" {
		vars["after"] = after
	}
	send(ctx, t, c, wsMsg{ID: "out", Type: "subscribe", Payload: rawJSON(t, map[string]any{"query": gqlExecOutputSub, "variables": vars})})
	return &wsExecClient{t: t, c: c}
}

// next returns the next output event, or ok=false when the subscription completed.
func (w *wsExecClient) next(ctx context.Context) (ev execOutputJSON, ok bool) {
	w.t.Helper()
	m := nextMsg(ctx, w.t, w.c)
	switch m.Type {
	case "complete":
		return ev, false
	case "next":
	default:
		w.t.Fatalf("got %s %s, want next or complete", m.Type, m.Payload)
	}
	var p struct {
		Data struct {
			ExecOutput *execOutputJSON `json:"execOutput"`
		} `json:"data"`
		Errors []e2e.GQLError `json:"errors"`
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil || len(p.Errors) > 0 || p.Data.ExecOutput == nil {
		w.t.Fatalf("got payload %s (%v), want an output event", m.Payload, err)
	}
	return *p.Data.ExecOutput, true
}

// chunkBytes returns a chunk event's exact bytes.
func chunkBytes(t *testing.T, ev execOutputJSON) []byte {
	t.Helper()
	if ev.DataBase64 == nil {
		t.Fatalf("chunk %s without dataBase64", ev.Cursor)
	}
	b, err := base64.StdEncoding.DecodeString(*ev.DataBase64)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Data != nil && *ev.Data != string(b) {
		t.Fatalf("chunk %s: data and dataBase64 differ", ev.Cursor)
	}
	return b
}

func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

func execDetached(t *testing.T, s *e2e.Server, id string, argv []string, headers ...string) string {
	t.Helper()
	var res struct {
		ExecID   string `json:"execId"`
		State    string `json:"state"`
		ExitCode *int   `json:"exitCode"`
	}
	s.GQL(t, gqlExecDetached, map[string]any{"id": id, "cmd": argv}, headers...).OK(t, "exec.exec", &res)
	if res.State != "RUNNING" || res.ExitCode != nil || !strings.HasPrefix(res.ExecID, "exec_") {
		t.Fatalf("exec with wait: false: got %+v, want state RUNNING, exitCode null and an id", res)
	}
	return res.ExecID
}

func TestExecStreaming(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: map[string]any{
		"reconcile_interval_ms": 300,
		"execs":                 map[string]any{"follow_lease_sec": 3},
	}}, 3)
	a, b := reps[0], reps[1]
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID

	e2e.Step(t, "resume-through-another-replica", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		execID := execDetached(t, a, id, []string{"seq", "1", "200000"}, e2e.HdrTenant1)
		// Read part of the output through replica A, then drop the connection mid-stream.
		w := dialExecOutput(ctx, t, a, e2e.KeyTenant1, execID, "")
		var got []byte
		cursor := ""
		for len(got) < 300_000 {
			ev, ok := w.next(ctx)
			if !ok || ev.Kind != "CHUNK" {
				t.Fatalf("got %+v (more %v) after %d bytes, want chunks", ev, ok, len(got))
			}
			got = append(got, chunkBytes(t, ev)...)
			cursor = ev.Cursor
		}
		w.c.CloseNow()
		// Resume from the last cursor through replica B.
		w = dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, cursor)
		var exit *execOutputJSON
		for {
			ev, ok := w.next(ctx)
			if !ok {
				break
			}
			switch ev.Kind {
			case "CHUNK":
				got = append(got, chunkBytes(t, ev)...)
			case "EXIT":
				exit = &ev
			default:
				t.Fatalf("got %+v, want chunks and the exit", ev)
			}
		}
		want := seqOutput(200000)
		if string(got) != want {
			t.Fatalf("joined output: %d bytes, want %d; first difference at %d", len(got), len(want), firstDiff(got, []byte(want)))
		}
		if exit == nil || exit.Result == nil || exit.Result.ExitCode == nil || *exit.Result.ExitCode != 0 || exit.Result.State != "ENDED" {
			t.Fatalf("exit event: got %+v", exit)
		}
		w.c.Close(websocket.StatusNormalClosure, "done")
	})

	e2e.Step(t, "sigkill-of-the-follower", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		k := reps[2]
		// A command that runs a few seconds, started through replica K (its follower).
		const n = 400
		execID := execDetached(t, k, id, []string{"sh", "-c", fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.01; done; exit 5", n)}, e2e.HdrTenant1)
		w := dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, "")
		var got []byte
		killed := false
		var exit *execOutputJSON
		for {
			ev, ok := w.next(ctx)
			if !ok {
				break
			}
			switch ev.Kind {
			case "CHUNK":
				got = append(got, chunkBytes(t, ev)...)
				if !killed && bytes.Count(got, []byte("\n")) >= 20 {
					k.Kill(t)
					killed = true
				}
			case "EXIT":
				exit = &ev
			default:
				t.Fatalf("got %+v, want chunks and the exit", ev)
			}
		}
		if !killed {
			t.Fatal("the command ended before the follower could be killed")
		}
		if want := seqOutput(n); string(got) != want {
			t.Fatalf("output across the SIGKILL: %d bytes, want %d; first difference at %d", len(got), len(want), firstDiff(got, []byte(want)))
		}
		if exit == nil || exit.Result == nil || exit.Result.ExitCode == nil || *exit.Result.ExitCode != 5 {
			t.Fatalf("exit event: got %+v, want exit code 5", exit)
		}
		var st execStatusJSON
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || st.ExitCode == nil || *st.ExitCode != 5 || st.Stdout != seqOutput(n) {
			t.Fatalf("GET the exec after the takeover: got state %s exit %v, %d bytes", st.State, st.ExitCode, len(st.Stdout))
		}
	})

	e2e.Step(t, "rest-sse", func(t *testing.T) {
		// curl -N -H 'Accept: text/event-stream' -d '{"command":[…]}' …/exec
		resp := sseRequest(t, b, http.MethodPost, e2e.Prefix+"/"+id+"/exec",
			`{"command":["sh","-c","seq 1 3000; echo oops >&2; exit 4"]}`, e2e.HdrTenant1)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		if len(evs) < 3 || evs[0].event != "started" || evs[len(evs)-1].event != "exit" {
			t.Fatalf("got events %v, want started, chunks, exit", sseKinds(evs))
		}
		var started execStatusJSON
		if err := json.Unmarshal([]byte(evs[0].data), &started); err != nil || started.State != "RUNNING" {
			t.Fatalf("started event %q: %v", evs[0].data, err)
		}
		stdout, stderr := sseOutput(t, evs)
		if stdout != seqOutput(3000) || stderr != "oops\n" {
			t.Fatalf("SSE output: %d stdout bytes, stderr %q", len(stdout), stderr)
		}
		var exit execStatusJSON
		if err := json.Unmarshal([]byte(evs[len(evs)-1].data), &exit); err != nil || exit.ExitCode == nil || *exit.ExitCode != 4 {
			t.Fatalf("exit event %q: %v", evs[len(evs)-1].data, err)
		}
		// Status and result from the other replica.
		var st execStatusJSON
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID, nil, e2e.HdrTenant1).Decode(t, &st)
		if st.State != "ENDED" || *st.ExitCode != 4 || st.Stdout != seqOutput(3000) || st.Stderr != "oops\n" {
			t.Fatalf("GET exec: got %+v", st)
		}
		// Reattach after the second chunk: with ?after= and with Last-Event-ID.
		mid := 2
		for mid < len(evs)-1 && evs[mid].event != "chunk" {
			mid++
		}
		wantRest := evs[mid+1:]
		for name, req := range map[string]func() *http.Response{
			"after": func() *http.Response {
				return sseRequest(t, a, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID+"/output?after="+evs[mid].id, "", e2e.HdrTenant1)
			},
			"last-event-id": func() *http.Response {
				return sseRequest(t, a, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+started.ExecID+"/output", "", e2e.HdrTenant1, "Last-Event-ID: "+evs[mid].id)
			},
		} {
			resp := req()
			rest := readSSE(t, resp.Body)
			resp.Body.Close()
			if len(rest) != len(wantRest) || rest[0].id != wantRest[0].id || rest[len(rest)-1].event != "exit" {
				t.Fatalf("%s: got %d events (%v), want %d from %s", name, len(rest), sseKinds(rest), len(wantRest), wantRest[0].id)
			}
		}
	})

	e2e.Step(t, "graphql-sse", func(t *testing.T) {
		execID := execDetached(t, a, id, []string{"sh", "-c", "seq 1 1000"}, e2e.HdrTenant1)
		body := e2e.MustJSON(t, map[string]any{"query": gqlExecOutputSub, "variables": map[string]any{"exec": execID}})
		resp := sseRequest(t, b, http.MethodPost, "/graphql", body, e2e.HdrTenant1, e2e.HdrJSON)
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		var out []byte
		var last execOutputJSON
		for _, e := range evs {
			if e.event != "next" {
				continue
			}
			var p struct {
				Data struct {
					ExecOutput execOutputJSON `json:"execOutput"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(e.data), &p); err != nil {
				t.Fatal(err)
			}
			last = p.Data.ExecOutput
			if last.Kind == "CHUNK" {
				out = append(out, chunkBytes(t, last)...)
			}
		}
		if string(out) != seqOutput(1000) || last.Kind != "EXIT" || *last.Result.ExitCode != 0 {
			t.Fatalf("GraphQL SSE: %d bytes, last %+v", len(out), last)
		}
	})

	e2e.Step(t, "auth-on-every-transport", func(t *testing.T) {
		execID := execDetached(t, a, id, []string{"true"}, e2e.HdrTenant1)
		// Another tenant's exec does not exist, through REST, GraphQL POST, SSE and WebSocket.
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID+"/output", nil, e2e.HdrTenant2, "Accept: text/event-stream").
			WantError(t, http.StatusNotFound, "NOT_FOUND")
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil).WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID+"/output", nil, "X-Api-Key: not-a-key").
			WantError(t, http.StatusUnauthorized, "UNAUTHENTICATED")
		a.GQL(t, `query($id: ID!) { exec(id: $id) { state } }`, map[string]any{"id": execID}, e2e.HdrTenant2).WantCode(t, http.StatusOK, "NOT_FOUND")
		body := e2e.MustJSON(t, map[string]any{"query": gqlExecOutputSub, "variables": map[string]any{"exec": execID}})
		r := a.Curl(t, http.MethodPost, "/graphql", []byte(body), e2e.HdrJSON, "Accept: text/event-stream", "X-Api-Key: not-a-key-of-this-server")
		if r.Status != http.StatusUnauthorized {
			t.Errorf("GraphQL SSE with a bad key: got %s, want 401", r)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := dialGraphQL(ctx, t, a)
		send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": e2e.KeyTenant2})})
		if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
			t.Fatalf("got %s, want connection_ack", m.Type)
		}
		send(ctx, t, c, wsMsg{ID: "x", Type: "subscribe", Payload: rawJSON(t, map[string]any{"query": gqlExecOutputSub,
			"variables": map[string]any{"exec": execID}})})
		m := nextMsg(ctx, t, c)
		if m.Type != "error" && m.Type != "next" || !strings.Contains(string(m.Payload), "NOT_FOUND") {
			t.Fatalf("another tenant's execOutput over WebSocket: got %s %s, want a NOT_FOUND error", m.Type, m.Payload)
		}
	})

	e2e.Step(t, "slow-subscriber-does-not-delay-a-fast-one", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		before := goroutines(t, b)
		// 8 MiB of output; the slow subscriber reads one event and then nothing.
		execID := execDetached(t, a, id, []string{"sh", "-c", "head -c 8388608 /dev/zero | tr '\\0' x"}, e2e.HdrTenant1)
		slow := dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, "")
		if _, ok := slow.next(ctx); !ok {
			t.Fatal("the slow subscriber got nothing")
		}
		slowSSE := sseRequest(t, b, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID+"/output", "", e2e.HdrTenant1)
		fast := dialExecOutput(ctx, t, b, e2e.KeyTenant1, execID, "")
		n := 0
		var exit *execOutputJSON
		for {
			ev, ok := fast.next(ctx)
			if !ok {
				break
			}
			switch ev.Kind {
			case "CHUNK":
				n += len(chunkBytes(t, ev))
			case "EXIT":
				exit = &ev
			}
		}
		if n != 8<<20 || exit == nil {
			t.Fatalf("the fast subscriber got %d bytes and exit %v while a slow one stalled", n, exit)
		}
		// The server answers everyone else meanwhile.
		b.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		fast.c.Close(websocket.StatusNormalClosure, "done")
		slow.c.CloseNow()
		slowSSE.Body.Close()
		// Everything the subscriptions held is let go.
		e2e.Eventually(t, 30*time.Second, "the server's goroutines to return to where they were", func() (bool, string) {
			g := goroutines(t, b)
			return g <= before+5, fmt.Sprintf("%d goroutines, %d before", g, before)
		})
	})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// execStatusJSON is the REST status and result of an exec.
type execStatusJSON struct {
	ExecID    string  `json:"exec_id"`
	SandboxID string  `json:"sandbox_id"`
	State     string  `json:"state"`
	ExitCode  *int    `json:"exit_code"`
	Stdout    string  `json:"stdout"`
	Stderr    string  `json:"stderr"`
	Error     *string `json:"error"`
}

type sseEvent struct{ id, event, data string }

func sseKinds(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.event)
	}
	return out
}

// sseRequest sends a request that answers Server-Sent Events and checks it does.
func sseRequest(t *testing.T, s *e2e.Server, method, path, body string, headers ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(name, strings.TrimSpace(value))
	}
	resp, err := s.HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %s: got %d %s %s, want 200 text/event-stream", method, path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// readSSE reads events to the end of the stream (comments skipped).
func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var out []sseEvent
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.event != "" || cur.data != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			cur.id = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "event:"):
			cur.event = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			cur.data += strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading SSE: %v", err)
	}
	return out
}

// sseOutput joins the chunk events of a REST exec stream.
func sseOutput(t *testing.T, evs []sseEvent) (stdout, stderr string) {
	t.Helper()
	var o, e []byte
	for _, ev := range evs {
		if ev.event != "chunk" {
			continue
		}
		var c struct {
			Stream     string  `json:"stream"`
			Data       *string `json:"data"`
			DataBase64 *string `json:"data_base64"`
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("chunk %q: %v", ev.data, err)
		}
		var b []byte
		switch {
		case c.Data != nil:
			b = []byte(*c.Data)
		case c.DataBase64 != nil:
			b, _ = base64.StdEncoding.DecodeString(*c.DataBase64)
		}
		if c.Stream == "stderr" {
			e = append(e, b...)
		} else {
			o = append(o, b...)
		}
	}
	return string(o), string(e)
}

var goroutinesLine = regexp.MustCompile(`(?m)^go_goroutines (\d+)`)

// goroutines reads the server's goroutine count from /metrics.
func goroutines(t *testing.T, s *e2e.Server) int {
	t.Helper()
	r := s.Curl(t, http.MethodGet, "/metrics", nil)
	m := goroutinesLine.FindSubmatch(r.Body)
	if m == nil {
		t.Fatalf("no go_goroutines in /metrics")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
