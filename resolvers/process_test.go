package resolvers

import (
	"testing"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

func TestExecsConnection(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	const q = `query($s: ExecState, $first: Int, $after: String) { execs(sandboxId: "` + apitest.SandboxRunning + `", state: $s, first: $first, after: $after) {
		edges { cursor node { execId state stdinOpen tty { rows cols } exitCode } }
		nodes { execId }
		pageInfo { hasNextPage hasPreviousPage startCursor endCursor } } }`
	type conn struct {
		Edges []struct {
			Cursor string
			Node   map[string]any
		}
		Nodes    []struct{ ExecID string }
		PageInfo struct {
			HasNextPage, HasPreviousPage bool
			StartCursor, EndCursor       *string
		}
	}
	var c conn
	r := e.post(t, apitest.UserKey, q, nil)
	noErrors(t, r)
	field(t, r, "execs", &c)
	if len(c.Edges) != 2 || c.Edges[0].Cursor != apitest.ExecRunning || c.Edges[1].Cursor != apitest.ExecEnded ||
		c.Nodes[0].ExecID != apitest.ExecRunning || c.PageInfo.HasNextPage || *c.PageInfo.EndCursor != apitest.ExecEnded {
		t.Fatalf("got %+v, want the running exec then the ended one on one page", c)
	}
	if n := c.Edges[0].Node; n["state"] != "RUNNING" || n["stdinOpen"] != false || n["tty"] != nil || n["exitCode"] != nil {
		t.Fatalf("the running exec: got %v", n)
	}
	if got := e.fake.Last("ListExecs").ExecList; got != (sandbox.ExecListOptions{Limit: 50}) {
		t.Fatalf("the service got %+v, want the default page of 50", got)
	}

	c = conn{}
	r = e.post(t, apitest.UserKey, q, map[string]any{"first": 1})
	noErrors(t, r)
	field(t, r, "execs", &c)
	if len(c.Edges) != 1 || !c.PageInfo.HasNextPage || *c.PageInfo.EndCursor != apitest.ExecRunning {
		t.Fatalf("a page of one: got %+v, want hasNextPage and the end cursor %s", c, apitest.ExecRunning)
	}
	next := *c.PageInfo.EndCursor
	c = conn{}
	r = e.post(t, apitest.UserKey, q, map[string]any{"first": 1, "after": next})
	noErrors(t, r)
	field(t, r, "execs", &c)
	if len(c.Edges) != 1 || c.Edges[0].Cursor != apitest.ExecEnded || c.PageInfo.HasNextPage {
		t.Fatalf("the second page: got %+v, want the ended exec and no next page", c)
	}

	r = e.post(t, apitest.UserKey, q, map[string]any{"s": "RUNNING", "after": "exec_9"})
	noErrors(t, r)
	if got := e.fake.Last("ListExecs").ExecList; got != (sandbox.ExecListOptions{Limit: 50, After: "exec_9", State: sandbox.ExecRunning}) {
		t.Fatalf("the service got %+v", got)
	}
	for name, tc := range map[string]struct {
		query string
		vars  map[string]any
		code  string
	}{
		"first-zero":      {q, map[string]any{"first": 0}, "INVALID_ARGUMENT"},
		"unknown-state":   {q, map[string]any{"s": "DONE"}, "GRAPHQL_VALIDATION_FAILED"},
		"unknown-sandbox": {`{ execs(sandboxId: "sbx_other") { nodes { execId } } }`, nil, "NOT_FOUND"},
	} {
		if r := e.post(t, apitest.UserKey, tc.query, tc.vars); r.code(0) != tc.code {
			t.Errorf("%s: got %+v, want %s", name, r.Errors, tc.code)
		}
	}
	// A listing has no output: selecting it on a big page is priced out before it runs.
	before := len(e.fake.CallsTo("ListExecs"))
	r = e.post(t, apitest.UserKey, `{ execs(sandboxId: "`+apitest.SandboxRunning+`", first: 500) { nodes { stdout } } }`, nil)
	if r.code(0) != "COST_EXCEEDED" || len(e.fake.CallsTo("ListExecs")) != before {
		t.Fatalf("500 execs with their stdout: got %+v, want COST_EXCEEDED before the service", r.Errors)
	}
	noErrors(t, e.post(t, apitest.UserKey, `{ execs(sandboxId: "`+apitest.SandboxRunning+`", first: 500) { nodes { execId state command } } }`, nil))
}

func TestSignalExecMutation(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	const q = `mutation($id: ID!, $sig: ExecSignal!) { signalExec(execId: $id, signal: $sig) { exec { execId state } } }`
	r := e.post(t, apitest.UserKey, q, map[string]any{"id": apitest.ExecRunning, "sig": "SIGINT"})
	noErrors(t, r)
	var res map[string]any
	field(t, r, "signalExec.exec", &res)
	if res["execId"] != apitest.ExecRunning || res["state"] != "RUNNING" {
		t.Fatalf("got %v", res)
	}
	if c := e.fake.Last("SignalExec"); c.Signal != "SIGINT" || c.SandboxID != "" || c.ID != apitest.ExecRunning {
		t.Fatalf("the service got %+v", c)
	}
	for _, sig := range []string{"SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"} {
		noErrors(t, e.post(t, apitest.UserKey, q, map[string]any{"id": apitest.ExecRunning, "sig": sig}))
	}
	r = e.post(t, apitest.UserKey, q, map[string]any{"id": apitest.ExecEnded, "sig": "SIGTERM"})
	if r.code(0) != "INVALID_STATE" || r.Errors[0].Extensions["state"] != "ENDED" {
		t.Fatalf("an ended exec: got %+v, want INVALID_STATE with state ENDED", r.Errors)
	}
	for _, sig := range []any{"SIGSTOP", "TERM", 9, nil} {
		if r := e.post(t, apitest.UserKey, q, map[string]any{"id": apitest.ExecRunning, "sig": sig}); r.code(0) != "GRAPHQL_VALIDATION_FAILED" {
			t.Errorf("signal %v: got %+v, want a validation error", sig, r.Errors)
		}
	}
	if r := e.post(t, apitest.UserKey, q, map[string]any{"id": "exec_other", "sig": "SIGTERM"}); r.code(0) != "NOT_FOUND" {
		t.Fatalf("an unknown exec: got %+v, want NOT_FOUND", r.Errors)
	}
}

func TestWriteExecStdinMutation(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	const q = `mutation($id: ID!, $d: String, $b: String, $c: Boolean) { writeExecStdin(execId: $id, data: $d, dataBase64: $b, close: $c) { written buffered closed } }`
	for name, tc := range map[string]struct {
		vars      map[string]any
		data      string
		closeWant bool
	}{
		"text":         {map[string]any{"d": "ls -l\n"}, "ls -l\n", false},
		"base64":       {map[string]any{"b": "AP8K"}, "\x00\xff\n", false},
		"close-only":   {map[string]any{"c": true}, "", true},
		"text-close":   {map[string]any{"d": "bye\n", "c": true}, "bye\n", true},
		"close-null":   {map[string]any{"d": "x", "c": nil}, "x", false},
		"empty-string": {map[string]any{"d": ""}, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			tc.vars["id"] = apitest.ExecRunning
			r := e.post(t, apitest.UserKey, q, tc.vars)
			noErrors(t, r)
			var res struct {
				Written, Buffered int64
				Closed            bool
			}
			field(t, r, "writeExecStdin", &res)
			c := e.fake.Last("WriteStdin")
			if string(c.Data) != tc.data || c.Close != tc.closeWant || res.Written != int64(len(tc.data)) || res.Closed != tc.closeWant {
				t.Fatalf("the service got %q close %v; answered %+v", c.Data, c.Close, res)
			}
		})
	}
	before := len(e.fake.CallsTo("WriteStdin"))
	for name, vars := range map[string]map[string]any{
		"both":       {"id": apitest.ExecRunning, "d": "x", "b": "eA=="},
		"bad-base64": {"id": apitest.ExecRunning, "b": "***"},
	} {
		if r := e.post(t, apitest.UserKey, q, vars); r.code(0) != "INVALID_ARGUMENT" {
			t.Errorf("%s: got %+v, want INVALID_ARGUMENT", name, r.Errors)
		}
	}
	if len(e.fake.CallsTo("WriteStdin")) != before {
		t.Fatalf("refused writes reached the service")
	}
	if r := e.post(t, apitest.UserKey, q, map[string]any{"id": apitest.ExecEnded, "d": "x"}); r.code(0) != "INVALID_STATE" {
		t.Fatalf("an ended exec: got %+v", r.Errors)
	}
}

func TestWriteExecStdinBufferFull(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	e.fake.StdinErr = apierror.New(apierror.LimitExceeded, "full").WithDetail("limit_name", "stdin_buffer_bytes").WithRetryAfter(1e9)
	r := e.post(t, apitest.UserKey, `mutation { writeExecStdin(execId: "`+apitest.ExecRunning+`", data: "x") { written } }`, nil)
	if r.code(0) != "LIMIT_EXCEEDED" || r.Errors[0].Extensions["retryAfter"] != 1.0 || r.Errors[0].Extensions["limit_name"] != "stdin_buffer_bytes" {
		t.Fatalf("got %+v, want LIMIT_EXCEEDED with retryAfter 1 and the limit's name", r.Errors)
	}
}

func TestResizeAndTerminalExec(t *testing.T) {
	e := newEnv(t, HandlerOptions{})
	r := e.post(t, apitest.UserKey, `mutation { resizeExecTty(execId: "`+apitest.ExecRunning+`", rows: 50, cols: 132) { exec { execId stdinOpen tty { rows cols } } } }`, nil)
	noErrors(t, r)
	var res struct {
		StdinOpen bool
		Tty       struct{ Rows, Cols int }
	}
	field(t, r, "resizeExecTty.exec", &res)
	if !res.StdinOpen || res.Tty.Rows != 50 || res.Tty.Cols != 132 {
		t.Fatalf("got %+v", res)
	}
	if c := e.fake.Last("ResizeTty"); c.Tty != (sandbox.TtySize{Rows: 50, Cols: 132}) || c.SandboxID != "" {
		t.Fatalf("the service got %+v", c)
	}
	if r := e.post(t, apitest.UserKey, `mutation { resizeExecTty(execId: "`+apitest.ExecRunning+`", rows: 0, cols: 132) { exec { execId } } }`, nil); r.code(0) != "INVALID_ARGUMENT" {
		t.Fatalf("rows 0: got %+v", r.Errors)
	}

	r = e.post(t, apitest.UserKey, `mutation { exec(sandboxId: "`+apitest.SandboxRunning+`", input: {command: ["bash", "-i"], stdinOpen: true, tty: {rows: 24, cols: 80}}, wait: false) { exec { execId } } }`, nil)
	noErrors(t, r)
	if req := e.fake.Last("Exec").Exec; !req.StdinOpen || req.Tty == nil || *req.Tty != (sandbox.TtySize{Rows: 24, Cols: 80}) || !req.Detach {
		t.Fatalf("the service got %+v", req)
	}
	r = e.post(t, apitest.UserKey, `mutation { exec(sandboxId: "`+apitest.SandboxRunning+`", input: {command: ["true"], tty: {rows: 24}}) { exec { execId } } }`, nil)
	if r.code(0) != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("a tty without cols: got %+v", r.Errors)
	}
	r = e.post(t, apitest.UserKey, `mutation { exec(sandboxId: "`+apitest.SandboxRunning+`", input: {command: ["true"]}) { exec { execId } } }`, nil)
	noErrors(t, r)
	if req := e.fake.Last("Exec").Exec; req.StdinOpen || req.Tty != nil {
		t.Fatalf("an exec without them: the service got %+v", req)
	}
}
