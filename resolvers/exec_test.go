package resolvers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"go.uber.org/goleak"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

const execResultFields = `execId sandboxId command state exitCode signal timedOut durationMs startedAt endedAt
	outputBytes stdout stderr stdoutBase64 stderrBase64 stdoutTruncated stderrTruncated error`

func TestExecWait(t *testing.T) {
	const q = `mutation($w: Boolean) { exec(sandboxId: "` + apitest.SandboxRunning + `", input: {command: ["sleep", "60"]}, wait: $w) { exec { ` +
		execResultFields + ` } } }`
	running := map[string]any{"execId": apitest.ExecRunning, "sandboxId": apitest.SandboxRunning, "command": "'sleep' '60'", "state": "RUNNING",
		"exitCode": nil, "signal": nil, "timedOut": false, "durationMs": nil, "startedAt": "2025-01-02T03:04:05Z",
		"endedAt": nil, "outputBytes": 12.0, "stdout": "", "stderr": "", "stdoutBase64": "", "stderrBase64": "",
		"stdoutTruncated": false, "stderrTruncated": false, "error": nil}
	ended := map[string]any{"execId": apitest.ExecEnded, "state": "ENDED", "exitCode": 3.0, "durationMs": 1500.0,
		"endedAt": "2025-01-02T03:04:06.5Z", "stderr": "warn\n"}
	tests := []struct {
		name       string
		vars       map[string]any
		wantDetach bool
		want       map[string]any
	}{
		{name: "wait-omitted", vars: map[string]any{}, want: ended},
		{name: "wait-null", vars: map[string]any{"w": nil}, want: ended},
		{name: "wait-true", vars: map[string]any{"w": true}, want: ended},
		{name: "wait-false", vars: map[string]any{"w": false}, wantDetach: true, want: running},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, HandlerOptions{})
			r := e.post(t, apitest.UserKey, q, tt.vars)
			noErrors(t, r)
			var res map[string]any
			field(t, r, "exec.exec", &res)
			for k, v := range tt.want {
				if got, ok := res[k]; !ok || !equalJSON(got, v) {
					t.Errorf("%s: got %v, want %v", k, got, v)
				}
			}
			if got := e.fake.Last("Exec").Exec.Detach; got != tt.wantDetach {
				t.Errorf("got Detach %v, want %v", got, tt.wantDetach)
			}
		})
	}
}

// getExecArgs is what GetExec was asked.
type getExecArgs struct {
	sandboxID, execID string
	output            bool
}

func TestExecQuery(t *testing.T) {
	tests := []struct {
		name       string
		query      string
		wantOutput bool
		want       map[string]any
	}{
		{name: "status-only", query: `{ exec(id: "` + apitest.ExecEnded + `") { execId state exitCode durationMs outputBytes } }`,
			want: map[string]any{"execId": apitest.ExecEnded, "state": "ENDED", "exitCode": 3.0, "durationMs": 1500.0, "outputBytes": 11.0}},
		{name: "running", query: `{ exec(id: "` + apitest.ExecRunning + `") { state exitCode durationMs endedAt timedOut } }`,
			want: map[string]any{"state": "RUNNING", "exitCode": nil, "durationMs": nil, "endedAt": nil, "timedOut": false}},
		{name: "stdout", query: `{ exec(id: "` + apitest.ExecEnded + `") { state stdout } }`, wantOutput: true,
			want: map[string]any{"state": "ENDED", "stdout": "hello\n"}},
		{name: "aliased-base64", query: `{ exec(id: "` + apitest.ExecEnded + `") { err: stderrBase64 } }`, wantOutput: true,
			want: map[string]any{"err": base64.StdEncoding.EncodeToString([]byte("oops\xff"))}},
		{name: "truncated-in-fragment", query: `{ exec(id: "` + apitest.ExecEnded + `") { ...F } } fragment F on ExecResult { stderrTruncated }`,
			wantOutput: true, want: map[string]any{"stderrTruncated": true}},
		{name: "inline-fragment", query: `{ exec(id: "` + apitest.ExecEnded + `") { ... on ExecResult { stderr } } }`, wantOutput: true,
			want: map[string]any{"stderr": "oops\uFFFD"}},
		{name: "skipped-output", query: `{ exec(id: "` + apitest.ExecEnded + `") { state stdout @skip(if: true) } }`,
			want: map[string]any{"state": "ENDED"}},
		{name: "typename-only", query: `{ exec(id: "` + apitest.ExecEnded + `") { __typename } }`,
			want: map[string]any{"__typename": "ExecResult"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, HandlerOptions{})
			r := e.post(t, apitest.UserKey, tt.query, nil)
			noErrors(t, r)
			var res map[string]any
			field(t, r, "exec", &res)
			if !equalJSON(res, tt.want) {
				t.Errorf("got %v, want %v", res, tt.want)
			}
			id := apitest.ExecEnded
			if tt.name == "running" {
				id = apitest.ExecRunning
			}
			c := e.fake.Last("GetExec")
			if got, want := (getExecArgs{c.SandboxID, c.ID, c.Output}), (getExecArgs{execID: id, output: tt.wantOutput}); got != want {
				t.Errorf("got GetExec%+v, want %+v", got, want)
			}
		})
	}
	t.Run("not-found", func(t *testing.T) {
		e := newEnv(t, HandlerOptions{})
		r := e.post(t, apitest.UserKey, `{ exec(id: "exec_other") { state } }`, nil)
		if got := r.code(0); got != "NOT_FOUND" {
			t.Fatalf("got %q (%+v), want NOT_FOUND", got, r.Errors)
		}
		if got := string(r.Data["exec"]); got != "null" {
			t.Errorf("got exec = %s, want null", got)
		}
	})
}

// ---- execOutput ----

const execOutputQuery = `subscription($id: ID!, $a: String) { execOutput(execId: $id, after: $a) {
	cursor kind stream data dataBase64 missedBytes result { execId state exitCode durationMs stdout outputBytes } } }`

// testExecEvents: a text chunk, a chunk that ends inside a multi-byte character, a gap, the
// rest of the character, and the exit.
func testExecEvents() []sandbox.ExecEvent {
	return []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "10-0", Stream: "stdout", Data: []byte("hello\n")},
		{Kind: sandbox.ExecChunk, Cursor: "20-0", Stream: "stderr", Data: []byte("price \xe2\x82")},
		{Kind: sandbox.ExecTruncated, Cursor: "90-0", MissedBytes: 42},
		{Kind: sandbox.ExecChunk, Cursor: "96-0", Stream: "stdout", Data: []byte("\xac!")},
		{Kind: sandbox.ExecExit, Cursor: "96-1", Result: new(apitest.EndedExec())},
	}
}

type execEventJSON struct {
	Cursor      string          `json:"cursor"`
	Kind        string          `json:"kind"`
	Stream      *string         `json:"stream"`
	Data        *string         `json:"data"`
	DataBase64  *string         `json:"dataBase64"`
	MissedBytes *int64          `json:"missedBytes"`
	Result      json.RawMessage `json:"result"`
}

func checkExecEvents(t *testing.T, got []execEventJSON) {
	t.Helper()
	str := func(s string) *string { return &s }
	b64 := func(s string) *string { return str(base64.StdEncoding.EncodeToString([]byte(s))) }
	missed := int64(42)
	want := []execEventJSON{
		{Cursor: "10-0", Kind: "CHUNK", Stream: str("STDOUT"), Data: str("hello\n"), DataBase64: b64("hello\n"), Result: json.RawMessage("null")},
		{Cursor: "20-0", Kind: "CHUNK", Stream: str("STDERR"), DataBase64: b64("price \xe2\x82"), Result: json.RawMessage("null")},
		{Cursor: "90-0", Kind: "TRUNCATED", MissedBytes: &missed, Result: json.RawMessage("null")},
		{Cursor: "96-0", Kind: "CHUNK", Stream: str("STDOUT"), DataBase64: b64("\xac!"), Result: json.RawMessage("null")},
		{Cursor: "96-1", Kind: "EXIT", Result: json.RawMessage(`{"execId":"exec_1","state":"ENDED","exitCode":3,"durationMs":1500,"stdout":"","outputBytes":11}`)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %s", len(got), len(want), mustJSON(got))
	}
	for i := range want {
		if g, w := mustJSON(got[i]), mustJSON(want[i]); !bytes.Equal(g, w) {
			t.Errorf("event %d: got %s, want %s", i, g, w)
		}
	}
}

// checkExecDrained waits for the fake's producer: it sent every event and closed its channel.
func checkExecDrained(ctx context.Context, t *testing.T, e *env, want int) {
	t.Helper()
	select {
	case end := <-e.fake.ExecDone():
		if !end.Drained || end.Sent != want {
			t.Errorf("got the service's stream ended after %d events (drained %v), want all %d sent and closed", end.Sent, end.Drained, want)
		}
	case <-ctx.Done():
		t.Fatal("the service's output stream did not end")
	}
}

func execOutputOf(t *testing.T, payload json.RawMessage) execEventJSON {
	t.Helper()
	var p struct {
		Data   struct{ ExecOutput execEventJSON } `json:"data"`
		Errors []any                              `json:"errors"`
	}
	if err := json.Unmarshal(payload, &p); err != nil || len(p.Errors) > 0 {
		t.Fatalf("bad next payload %s (%v)", payload, err)
	}
	return p.Data.ExecOutput
}

// wsSubscribe opens a graphql-transport-ws connection, authenticates and subscribes with id 1.
func wsSubscribe(ctx context.Context, t *testing.T, e *env, query string, vars map[string]any) *websocket.Conn {
	t.Helper()
	c := dialWS(ctx, t, e, "graphql-transport-ws", nil)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: mustJSON(map[string]any{"X-Api-Key": apitest.UserKey})})
	if m := next(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: mustJSON(map[string]any{"query": query, "variables": vars})})
	return c
}

func TestExecOutputWebsocket(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.ExecEvents[apitest.ExecEnded] = testExecEvents()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := wsSubscribe(ctx, t, e, execOutputQuery, map[string]any{"id": apitest.ExecEnded, "a": "5-0"})
	var got []execEventJSON
	for {
		m := next(ctx, t, c)
		if m.ID != "1" {
			t.Fatalf("got message for id %q, want 1: %+v", m.ID, m)
		}
		if m.Type == "complete" {
			break
		}
		if m.Type != "next" {
			t.Fatalf("got %s %s, want next", m.Type, m.Payload)
		}
		got = append(got, execOutputOf(t, m.Payload))
	}
	checkExecEvents(t, got)
	checkExecDrained(ctx, t, e, len(testExecEvents()))
	if c := e.fake.Last("ExecOutput"); c.ID != apitest.ExecEnded || c.After != "5-0" {
		t.Errorf("got ExecOutput(%q, %q), want the exec id and cursor", c.ID, c.After)
	}
	if p := e.fake.LastPrincipal(); p.Scope() != "acme:web" {
		t.Errorf("got principal %+v, want acme:web", p)
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestExecOutputSSE(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.ExecEvents[apitest.ExecEnded] = testExecEvents()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, sc := postSSEVars(t, e, apitest.UserKey, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
	var got []execEventJSON
	for _, data := range readSSE(t, sc) {
		got = append(got, execOutputOf(t, data))
	}
	checkExecEvents(t, got)
	checkExecDrained(ctx, t, e, len(testExecEvents()))
	if c := e.fake.Last("ExecOutput"); c.ID != apitest.ExecEnded || c.After != "" {
		t.Errorf("got ExecOutput(%q, %q), want from the start", c.ID, c.After)
	}
}

// The subscription ends after EXIT even when the service's channel stays open.
func TestExecOutputEndsAfterExit(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.ExecEvents[apitest.ExecEnded], e.fake.ExecEndless = testExecEvents(), []byte("after the exit")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, sc := postSSEVars(t, e, apitest.UserKey, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
	var got []execEventJSON
	for _, data := range readSSE(t, sc) {
		got = append(got, execOutputOf(t, data))
	}
	checkExecEvents(t, got)
	select {
	case end := <-e.fake.ExecDone():
		if end.Drained {
			t.Errorf("got the endless stream drained, want it stopped by the subscription's end")
		}
	case <-ctx.Done():
		t.Fatal("the service's output stream did not end with the subscription")
	}
}

func TestExecOutputErrors(t *testing.T) {
	tests := []struct {
		name      string
		vars      map[string]any
		wantCode  string
		wantField string
	}{
		{name: "not-found", vars: map[string]any{"id": "exec_other"}, wantCode: "NOT_FOUND"},
		{name: "bad-cursor", vars: map[string]any{"id": apitest.ExecEnded, "a": apitest.BadCursor}, wantCode: "INVALID_ARGUMENT", wantField: "after"},
	}
	for _, tt := range tests {
		check := func(t *testing.T, payload json.RawMessage) {
			t.Helper()
			var p struct {
				Data   json.RawMessage `json:"data"`
				Errors []struct {
					Message    string         `json:"message"`
					Path       []any          `json:"path"`
					Extensions map[string]any `json:"extensions"`
				} `json:"errors"`
			}
			if err := json.Unmarshal(payload, &p); err != nil || len(p.Errors) != 1 {
				t.Fatalf("got %s (%v), want one error", payload, err)
			}
			if got := p.Errors[0].Extensions["code"]; got != tt.wantCode {
				t.Errorf("got code %v, want %s (%s)", got, tt.wantCode, payload)
			}
			if tt.wantField != "" && p.Errors[0].Extensions["field"] != tt.wantField {
				t.Errorf("got extensions %v, want field %s", p.Errors[0].Extensions, tt.wantField)
			}
		}
		t.Run(tt.name+"/websocket", func(t *testing.T) {
			e := newEnv(t, HandlerOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := wsSubscribe(ctx, t, e, execOutputQuery, tt.vars)
			m := next(ctx, t, c)
			if m.Type != "next" {
				t.Fatalf("got %s %s, want next with the error", m.Type, m.Payload)
			}
			check(t, m.Payload)
			if m := next(ctx, t, c); m.Type != "complete" {
				t.Errorf("got %s %s, want complete", m.Type, m.Payload)
			}
			c.Close(websocket.StatusNormalClosure, "")
		})
		t.Run(tt.name+"/sse", func(t *testing.T) {
			e := newEnv(t, HandlerOptions{})
			_, sc := postSSEVars(t, e, apitest.UserKey, execOutputQuery, tt.vars)
			data := readSSE(t, sc)
			if len(data) != 1 {
				t.Fatalf("got %d events %s, want one error", len(data), data)
			}
			check(t, data[0])
		})
	}
}

func TestSandboxEventsCarryExecs(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	running := apitest.RunningExec(apitest.SandboxRunning)
	e.fake.SandboxEvents, e.fake.SandboxEventsEnd = []sandbox.Event{
		{Cursor: "1-0", Type: sandbox.EventExecStarted, SandboxID: apitest.SandboxRunning, State: sandbox.Running, At: apitest.T0, Exec: &running},
		{Cursor: "2-0", Type: sandbox.EventExecEnded, SandboxID: apitest.SandboxRunning, State: sandbox.Running, At: apitest.T0, Exec: new(apitest.EndedExec())},
		{Cursor: "3-0", Type: sandbox.EventStateChanged, SandboxID: apitest.SandboxRunning, State: sandbox.Stopping,
			PreviousState: sandbox.Running, At: apitest.T0},
	}, true
	_, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents { cursor type state previousState exec { execId state exitCode command } } }`)
	var got []string
	for _, data := range untilBrokeOff(t, readSSE(t, sc)) {
		got = append(got, string(data))
	}
	want := []string{
		`{"data":{"sandboxEvents":{"cursor":"1-0","type":"EXEC_STARTED","state":"RUNNING","previousState":null,"exec":{"execId":"exec_2","state":"RUNNING","exitCode":null,"command":"'sleep' '60'"}}}}`,
		`{"data":{"sandboxEvents":{"cursor":"2-0","type":"EXEC_ENDED","state":"RUNNING","previousState":null,"exec":{"execId":"exec_1","state":"ENDED","exitCode":3,"command":"'make' 'test'"}}}}`,
		`{"data":{"sandboxEvents":{"cursor":"3-0","type":"STATE_CHANGED","state":"STOPPING","previousState":"RUNNING","exec":null}}}`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events %s, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: got %s, want %s", i, got[i], want[i])
		}
	}
}

// ---- backpressure ----

// A subscriber that stops reading is cut off when one write misses WriteTimeout: the
// subscription and the service's stream end, and no goroutine is left behind.
func TestStalledSubscriberIsCutOff(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	tests := []struct {
		name      string
		subscribe func(ctx context.Context, t *testing.T, e *env) (stop func())
	}{
		{name: "websocket", subscribe: func(ctx context.Context, t *testing.T, e *env) func() {
			c := wsSubscribe(ctx, t, e, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
			return func() { c.CloseNow() } // it never reads again
		}},
		{name: "sse", subscribe: func(ctx context.Context, t *testing.T, e *env) func() {
			resp, _ := postSSEVars(t, e, apitest.UserKey, execOutputQuery, map[string]any{"id": apitest.ExecEnded})
			return func() { resp.Body.Close() } // it never reads the body
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			e := newEnv(t, HandlerOptions{WriteTimeout: writeTimeout})
			e.fake.ExecEndless = bytes.Repeat([]byte("x"), 64<<10)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			stop := tt.subscribe(ctx, t, e)
			start := time.Now()
			select {
			case end := <-e.fake.ExecDone():
				// The socket buffers fill within milliseconds; then one write waits writeTimeout.
				if d := time.Since(start); d > writeTimeout+5*time.Second {
					t.Errorf("the stalled subscription ended after %v, want about %v", d, writeTimeout)
				}
				if end.Drained || end.Sent == 0 {
					t.Errorf("got %+v, want a stream stopped by the subscriber's end after some events", end)
				}
			case <-ctx.Done():
				t.Fatal("the server still writes to a subscriber that stopped reading")
			}
			// net/http may end the request's context on the failed write before the handler
			// sees the error and logs it.
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(e.logs.String(), "write timed out"); {
				if time.Now().After(deadline) {
					t.Errorf("the cut-off was not logged; logs:\n%s", e.logs.String())
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			stop()
			e.srv.Client().CloseIdleConnections()
			e.srv.Close()
			goleak.VerifyNone(t, ignore)
		})
	}
}

// An idle stream that lasts many write timeouts gets keepalives and is not cut off: the
// deadline bounds each write, not the stream.
func TestIdleStreamGetsKeepalives(t *testing.T) {
	const want = 5
	opts := HandlerOptions{KeepAlivePingInterval: 50 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}
	t.Run("websocket", func(t *testing.T) {
		e := newEnv(t, opts)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := idleSubscription(ctx, t, e)
		for pings := 0; pings < want; {
			var m wsMsg
			if err := wsjson.Read(ctx, c, &m); err != nil {
				t.Fatalf("after %d pings: %v", pings, err)
			}
			if m.Type != "ping" {
				t.Fatalf("got %s %s, want ping", m.Type, m.Payload)
			}
			pings++
		}
		c.Close(websocket.StatusNormalClosure, "")
		select {
		case <-e.fake.EventsDone():
		case <-ctx.Done():
			t.Fatal("the service's event stream did not end after the client left")
		}
	})
	t.Run("sse", func(t *testing.T) {
		e := newEnv(t, opts)
		e.fake.SandboxEvents = testEvents()[:1]
		resp, sc := postSSE(t, e, apitest.UserKey, `subscription { sandboxEvents { cursor } }`)
		if resp.StatusCode != 200 {
			t.Fatalf("got %d, want 200", resp.StatusCode)
		}
		pings := 0
		for pings < want && sc.Scan() {
			if sc.Text() == ": ping" {
				pings++
			}
		}
		if pings < want {
			t.Fatalf("got %d keepalives, then the stream ended (%v); want %d", pings, sc.Err(), want)
		}
		resp.Body.Close()
		select {
		case <-e.fake.EventsDone():
		case <-time.After(10 * time.Second):
			t.Fatal("the service's event stream did not end after the client left")
		}
	})
}
