package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/tests/e2e"
)

// procStatusJSON is an exec's status as REST answers it (GET …/execs/{exec_id}, a list's
// entries, signal and resize answers).
type procStatusJSON struct {
	ExecID    string `json:"exec_id"`
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	Command   string `json:"command"`
	ExitCode  *int   `json:"exit_code"`
	Signal    string `json:"signal"`
	Stdout    string `json:"stdout"`
	StdinOpen *bool  `json:"stdin_open"`
	Tty       *struct {
		Rows int `json:"rows"`
		Cols int `json:"cols"`
	} `json:"tty"`
}

type procListJSON struct {
	Execs      []procStatusJSON `json:"execs"`
	NextCursor string           `json:"next_cursor"`
}

// startDetached starts a command with "wait": false (202) and returns its status.
func startDetached(t *testing.T, s *e2e.Server, id, body, hdr string) procStatusJSON {
	t.Helper()
	r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(body), e2e.HdrJSON, hdr)
	r.Want(t, http.StatusAccepted)
	var st procStatusJSON
	r.Decode(t, &st)
	if st.State != "RUNNING" || st.ExecID == "" {
		t.Fatalf("%s: want a RUNNING exec", r)
	}
	return st
}

func execStatus(t *testing.T, s *e2e.Server, id, execID, hdr string) procStatusJSON {
	t.Helper()
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs/"+execID, nil, hdr)
	r.Want(t, http.StatusOK)
	var st procStatusJSON
	r.Decode(t, &st)
	return st
}

// waitEnded polls an exec's status until it ENDED.
func waitEnded(t *testing.T, s *e2e.Server, id, execID, hdr string) procStatusJSON {
	t.Helper()
	var st procStatusJSON
	e2e.Eventually(t, 60*time.Second, "exec "+execID+" ENDED", func() (bool, string) {
		st = execStatus(t, s, id, execID, hdr)
		return st.State == "ENDED", st.State
	})
	return st
}

func listExecs(t *testing.T, s *e2e.Server, id, query, hdr string) procListJSON {
	t.Helper()
	r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs"+query, nil, hdr)
	r.Want(t, http.StatusOK)
	var l procListJSON
	r.Decode(t, &l)
	return l
}

func ids(l procListJSON) []string {
	var out []string
	for _, e := range l.Execs {
		out = append(out, e.ExecID)
	}
	return out
}

// gqlWS is one graphql-transport-ws connection, initialised with a key.
type gqlWS struct {
	c  *websocket.Conn
	n  int
	cx context.Context
}

func dialGQL(ctx context.Context, t *testing.T, s *e2e.Server, key string) *gqlWS {
	t.Helper()
	c := dialGraphQL(ctx, t, s)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": key})})
	if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s %s, want connection_ack", m.Type, m.Payload)
	}
	return &gqlWS{c: c, cx: ctx}
}

// do runs one query or mutation over the socket and returns its one result.
func (g *gqlWS) do(t *testing.T, query string, vars map[string]any) gqlResult {
	t.Helper()
	g.n++
	id := strconv.Itoa(g.n)
	send(g.cx, t, g.c, wsMsg{ID: id, Type: "subscribe", Payload: rawJSON(t, map[string]any{"query": query, "variables": vars})})
	var res gqlResult
	for {
		m := nextMsg(g.cx, t, g.c)
		if m.ID != id {
			if m.Type == "complete" {
				continue // the end of an earlier operation that ended with an error
			}
			t.Fatalf("got %s for operation %q, want operation %s", m.Type, m.ID, id)
		}
		switch m.Type {
		case "next":
			if err := json.Unmarshal(m.Payload, &res); err != nil {
				t.Fatalf("payload %s: %v", m.Payload, err)
			}
		case "error":
			var errs []e2e.GQLError
			_ = json.Unmarshal(m.Payload, &errs)
			return gqlResult{Errors: errs}
		case "complete":
			return res
		}
	}
}

type gqlResult struct {
	Data   map[string]json.RawMessage `json:"data"`
	Errors []e2e.GQLError             `json:"errors"`
}

func (r gqlResult) code() string {
	if len(r.Errors) == 0 {
		return ""
	}
	return r.Errors[0].Code()
}

func (r gqlResult) field(t *testing.T, name string, v any) {
	t.Helper()
	if len(r.Errors) > 0 {
		t.Fatalf("got errors %+v", r.Errors)
	}
	root, rest, _ := strings.Cut(name, ".")
	raw := r.Data[root]
	for rest != "" {
		var key string
		key, rest, _ = strings.Cut(rest, ".")
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("data.%s %s: %v", name, raw, err)
		}
		raw = obj[key]
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("data.%s %s: %v", name, raw, err)
	}
}

// psCount counts the lines of `ps -eo args` in the sandbox that are exactly one of want.
func psCount(t *testing.T, s *e2e.Server, id, hdr string, want ...string) (int, string) {
	t.Helper()
	out := s.Run(t, id, []string{"ps", "-eo", "args"}, hdr)
	n := 0
	for _, line := range strings.Split(out, "\n") {
		for _, w := range want {
			if strings.TrimSpace(line) == w {
				n++
			}
		}
	}
	return n, out
}

// TestProcessControl: list a sandbox's execs by state, signal a process tree, stream stdin, on
// the built server over real runsc, through curl-shaped REST and graphql-transport-ws, with
// another tenant's ids NOT_FOUND everywhere.
func TestProcessControl(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	id := s.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	gql := dialGQL(ctx, t, s, e2e.KeyTenant1)

	var ended, running procStatusJSON
	e2e.Step(t, "list-running-vs-ended", func(t *testing.T) {
		r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		r.Decode(t, &ended)
		running = startDetached(t, s, id, `{"command":["sleep","300"],"wait":false}`, e2e.HdrTenant1)

		all := listExecs(t, s, id, "", e2e.HdrTenant1)
		if got := ids(all); len(got) != 2 || got[0] != running.ExecID || got[1] != ended.ExecID || all.NextCursor != "" {
			t.Fatalf("all: got %v, want [%s %s]", got, running.ExecID, ended.ExecID)
		}
		if e := all.Execs[0]; e.State != "RUNNING" || e.Command != "sleep 300" || e.StdinOpen == nil || *e.StdinOpen || e.ExitCode != nil {
			t.Fatalf("the running exec: got %+v", e)
		}
		if e := all.Execs[1]; e.State != "ENDED" || e.ExitCode == nil || *e.ExitCode != 0 || e.Stdout != "" {
			t.Fatalf("the ended exec: got %+v", e)
		}
		if got := ids(listExecs(t, s, id, "?state=RUNNING", e2e.HdrTenant1)); len(got) != 1 || got[0] != running.ExecID {
			t.Fatalf("RUNNING: got %v", got)
		}
		if got := ids(listExecs(t, s, id, "?state=ENDED", e2e.HdrTenant1)); len(got) != 1 || got[0] != ended.ExecID {
			t.Fatalf("ENDED: got %v", got)
		}
		page := listExecs(t, s, id, "?limit=1", e2e.HdrTenant1)
		if got := ids(page); len(got) != 1 || got[0] != running.ExecID || page.NextCursor != running.ExecID {
			t.Fatalf("a page of one: got %v next %q", got, page.NextCursor)
		}
		if got := ids(listExecs(t, s, id, "?limit=1&cursor="+page.NextCursor, e2e.HdrTenant1)); len(got) != 1 || got[0] != ended.ExecID {
			t.Fatalf("the second page: got %v", got)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs?state=DONE", nil, e2e.HdrTenant1).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id+"/execs?limit=100000", nil, e2e.HdrTenant1).WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")

		// GraphQL: the same lists as a connection.
		const q = `query($id: ID!, $s: ExecState, $first: Int, $after: String) { execs(sandboxId: $id, state: $s, first: $first, after: $after) {
			edges { cursor node { execId state stdinOpen } } pageInfo { hasNextPage endCursor } } }`
		var conn struct {
			Edges []struct {
				Cursor string
				Node   struct {
					ExecID string
					State  string
				}
			}
			PageInfo struct {
				HasNextPage bool
				EndCursor   *string
			}
		}
		gql.do(t, q, map[string]any{"id": id, "s": "RUNNING"}).field(t, "execs", &conn)
		if len(conn.Edges) != 1 || conn.Edges[0].Node.ExecID != running.ExecID || conn.PageInfo.HasNextPage {
			t.Fatalf("GraphQL RUNNING: got %+v", conn)
		}
		gql.do(t, q, map[string]any{"id": id, "first": 1}).field(t, "execs", &conn)
		if len(conn.Edges) != 1 || !conn.PageInfo.HasNextPage || *conn.PageInfo.EndCursor != running.ExecID {
			t.Fatalf("GraphQL first 1: got %+v", conn)
		}
		gql.do(t, q, map[string]any{"id": id, "first": 1, "after": *conn.PageInfo.EndCursor}).field(t, "execs", &conn)
		if len(conn.Edges) != 1 || conn.Edges[0].Node.ExecID != ended.ExecID || conn.PageInfo.HasNextPage || conn.Edges[0].Node.State != "ENDED" {
			t.Fatalf("GraphQL second page: got %+v", conn)
		}
	})

	e2e.Step(t, "signals-reach-the-tree", func(t *testing.T) {
		for i, tc := range []struct {
			sig     string
			graphql bool
			// escape adds a child in a session of its own (setsid) in the background: a
			// non-interactive shell starts background commands with SIGINT ignored, so not
			// for SIGINT.
			escape bool
		}{
			{"SIGTERM", false, true},
			{"SIGKILL", true, true},
			{"SIGINT", false, false},
			{"SIGHUP", true, false},
		} {
			fg := fmt.Sprintf("sleep %d", 2001+10*i)
			bg := fmt.Sprintf("sleep %d", 2002+10*i)
			script := `sh -c "exec ` + fg + `"; echo unreachable`
			want := []string{fg}
			if tc.escape {
				script = `setsid ` + bg + ` & ` + script
				want = append(want, bg)
			}
			st := startDetached(t, s, id, e2e.MustJSON(t, map[string]any{"command": []string{"sh", "-c", script}, "wait": false}), e2e.HdrTenant1)
			e2e.Eventually(t, 30*time.Second, "the tree of "+tc.sig+" running", func() (bool, string) {
				n, ps := psCount(t, s, id, e2e.HdrTenant1, want...)
				return n == len(want), ps
			})
			if tc.graphql {
				var res struct{ ExecID, State string }
				gql.do(t, `mutation($id: ID!, $sig: ExecSignal!) { signalExec(execId: $id, signal: $sig) { exec { execId state } } }`,
					map[string]any{"id": st.ExecID, "sig": tc.sig}).field(t, "signalExec.exec", &res)
				if res.ExecID != st.ExecID {
					t.Fatalf("signalExec: got %+v", res)
				}
			} else {
				r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/signal", []byte(`{"signal":"`+tc.sig+`"}`), e2e.HdrJSON, e2e.HdrTenant1)
				r.Want(t, http.StatusOK)
			}
			end := waitEnded(t, s, id, st.ExecID, e2e.HdrTenant1)
			if end.Signal != tc.sig {
				t.Fatalf("%s: the exec ended with %+v, want signal %s", tc.sig, end, tc.sig)
			}
			e2e.Eventually(t, 30*time.Second, "the tree of "+tc.sig+" gone", func() (bool, string) {
				n, ps := psCount(t, s, id, e2e.HdrTenant1, want...)
				return n == 0, ps
			})
			// Once ended, it takes no signal.
			r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/signal", []byte(`{"signal":"SIGKILL"}`), e2e.HdrJSON, e2e.HdrTenant1)
			if e := r.WantError(t, http.StatusConflict, "INVALID_STATE", "ended"); e.Error.State != "ENDED" {
				t.Fatalf("%s: got state %q in the error, want ENDED", r, e.Error.State)
			}
		}
		for _, body := range []string{`{"signal":"SIGSTOP"}`, `{"signal":"9"}`, `{}`, `{"signal":"SIGTERM","x":1}`} {
			s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+running.ExecID+"/signal", []byte(body), e2e.HdrJSON, e2e.HdrTenant1).
				WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		}
		if r := gql.do(t, `mutation { signalExec(execId: "`+running.ExecID+`", signal: SIGSTOP) { exec { execId } } }`, nil); r.code() != "GRAPHQL_VALIDATION_FAILED" {
			t.Fatalf("GraphQL SIGSTOP: got %+v", r.Errors)
		}
	})

	e2e.Step(t, "stdin-streamed-then-closed", func(t *testing.T) {
		st := startDetached(t, s, id, `{"command":["sha256sum"],"stdin_open":true,"wait":false}`, e2e.HdrTenant1)
		if st.StdinOpen == nil || !*st.StdinOpen {
			t.Fatalf("status: got %+v, want stdin_open", st)
		}
		var all []byte
		for i := range 4 {
			part := make([]byte, 300<<10+i)
			_, _ = rand.Read(part)
			q := ""
			if i == 3 {
				q = "?close=true"
			}
			var r *e2e.Response
			e2e.Eventually(t, 30*time.Second, "stdin write "+strconv.Itoa(i)+" taken", func() (bool, string) {
				r = s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/stdin"+q, part, "Content-Type: application/octet-stream", e2e.HdrTenant1)
				return r.Status != http.StatusTooManyRequests, r.String()
			})
			r.Want(t, http.StatusOK)
			var res struct {
				Written int64
				Closed  bool
			}
			r.Decode(t, &res)
			if res.Written != int64(len(part)) || res.Closed != (i == 3) {
				t.Fatalf("write %d: got %+v", i, res)
			}
			all = append(all, part...)
		}
		end := waitEnded(t, s, id, st.ExecID, e2e.HdrTenant1)
		sum := sha256.Sum256(all)
		if want := hex.EncodeToString(sum[:]) + "  -\n"; end.Stdout != want || *end.ExitCode != 0 {
			t.Fatalf("sha256sum of %d bytes streamed in 4 writes: got %q, want %q", len(all), end.Stdout, want)
		}
		if end.StdinOpen == nil || *end.StdinOpen {
			t.Fatalf("an ended exec's status: got stdin_open %v, want false", end.StdinOpen)
		}

		// GraphQL: wc -c of text and base64 writes, closed by the last one.
		wc := startDetached(t, s, id, `{"command":["wc","-c"],"stdin_open":true,"wait":false}`, e2e.HdrTenant1)
		const m = `mutation($id: ID!, $d: String, $b: String, $c: Boolean) { writeExecStdin(execId: $id, data: $d, dataBase64: $b, close: $c) { written buffered closed } }`
		var res struct {
			Written int64
			Closed  bool
		}
		gql.do(t, m, map[string]any{"id": wc.ExecID, "d": "hello, "}).field(t, "writeExecStdin", &res)
		if res.Written != 7 || res.Closed {
			t.Fatalf("text write: got %+v", res)
		}
		gql.do(t, m, map[string]any{"id": wc.ExecID, "b": base64.StdEncoding.EncodeToString([]byte("\x00\xffworld\n")), "c": true}).field(t, "writeExecStdin", &res)
		if res.Written != 8 || !res.Closed {
			t.Fatalf("base64 write with close: got %+v", res)
		}
		if end := waitEnded(t, s, id, wc.ExecID, e2e.HdrTenant1); strings.TrimSpace(end.Stdout) != "15" {
			t.Fatalf("wc -c: got %q, want 15", end.Stdout)
		}
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+wc.ExecID+"/stdin", []byte("late"), e2e.HdrTenant1).
			WantError(t, http.StatusConflict, "INVALID_STATE")
	})

	e2e.Step(t, "stdin-bounds", func(t *testing.T) {
		// A command that never reads: its buffer fills and a write is refused whole, 429.
		st := startDetached(t, s, id, `{"command":["sleep","300"],"stdin_open":true,"wait":false}`, e2e.HdrTenant1)
		mib := bytes.Repeat([]byte("z"), 1<<20)
		var full *e2e.Response
		for range 4 {
			r := s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/stdin", mib, e2e.HdrTenant1)
			if r.Status != http.StatusOK {
				full = r
				break
			}
		}
		if full == nil {
			t.Fatalf("4 MiB into a command that never reads were all taken")
		}
		full.WantError(t, http.StatusTooManyRequests, "LIMIT_EXCEEDED", "stdin buffer")
		if full.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: no Retry-After", full)
		}
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/stdin", append(mib, 'x'), e2e.HdrTenant1).
			WantError(t, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/stdin?close=perhaps", []byte("x"), e2e.HdrTenant1).
			WantError(t, http.StatusBadRequest, "INVALID_ARGUMENT")
		// Without stdin_open there is no stdin to write to.
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+running.ExecID+"/stdin", []byte("x"), e2e.HdrTenant1).
			WantError(t, http.StatusConflict, "INVALID_STATE", "stdin")
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/execs/"+st.ExecID+"/signal", []byte(`{"signal":"SIGKILL"}`), e2e.HdrJSON, e2e.HdrTenant1).
			Want(t, http.StatusOK)
	})

	e2e.Step(t, "another-tenants-ids-are-not-found", func(t *testing.T) {
		base := e2e.Prefix + "/" + id + "/execs/" + running.ExecID
		for _, c := range []struct{ method, path, body string }{
			{http.MethodGet, e2e.Prefix + "/" + id + "/execs", ""},
			{http.MethodGet, base, ""},
			{http.MethodGet, base + "/output", ""},
			{http.MethodPost, base + "/signal", `{"signal":"SIGKILL"}`},
			{http.MethodPost, base + "/stdin", "rm -rf /\n"},
			{http.MethodPost, base + "/resize", `{"rows":10,"cols":10}`},
			{http.MethodGet, base + "/tty", ""},
		} {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			s.Curl(t, c.method, c.path, body, e2e.HdrJSON, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		}
		other := dialGQL(ctx, t, s, e2e.KeyTenant2)
		for _, q := range []string{
			`{ execs(sandboxId: "` + id + `") { nodes { execId } } }`,
			`mutation { signalExec(execId: "` + running.ExecID + `", signal: SIGKILL) { exec { execId } } }`,
			`mutation { writeExecStdin(execId: "` + running.ExecID + `", data: "x") { written } }`,
			`mutation { resizeExecTty(execId: "` + running.ExecID + `", rows: 5, cols: 5) { exec { execId } } }`,
		} {
			if r := other.do(t, q, nil); r.code() != "NOT_FOUND" {
				t.Errorf("%s as another tenant: got %+v, want NOT_FOUND", q, r.Errors)
			}
		}
		if st := execStatus(t, s, id, running.ExecID, e2e.HdrTenant1); st.State != "RUNNING" {
			t.Fatalf("another tenant's calls changed the exec: %+v", st)
		}
	})
}
