package resolvers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/graph"
	"sandboxd/graph/model"
	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
)

// FuzzGraphQLInputs turns fuzz bytes, taken as the variables of one operation, into service
// inputs twice: decoded into the gqlgen model inputs and converted (createRequest,
// execRequest, oneOf and fileMode, agentRunRequest, listOptions, listDirArgs, pageSize,
// readLimit, updateRequest), and sent through gqlgen's executable schema (its variable coercion, then the
// resolvers, then the same conversions) to a recording service. Neither may panic; a refusal
// of the conversions is INVALID_ARGUMENT; what reaches the service holds the conversions'
// promises: env without a name lost, stdin and content from exactly one of text and base64,
// detach only for wait: false, modes of permission bits only, positive page sizes, read
// limits of 1 to 10 MiB, config a JSON object.
func FuzzGraphQLInputs(f *testing.F) {
	for _, s := range []struct {
		op   uint8
		vars string
	}{
		{gfCreate, `{"input":{}}`},
		{gfCreate, `{"input":{"profile":"small","autostopSec":60,"ttlSec":3600,"env":[{"name":"A","value":"1"}],"source":{"snapshotId":"snap_1"}}}`},
		{gfCreate, `{"input":{"env":[{"name":"A","value":"1"},{"name":"A","value":"2"}]}}`},
		{gfCreate, `{"input":{"env":[null]}}`},
		{gfCreate, `{"input":{"autostopSec":4294967296}}`},
		{gfCreate, `{"input":{"ENV":[]}}`},
		{gfExec, `{"id":"sbx_1","input":{"command":["bash","-lc","ls"],"timeoutSec":5,"cwd":"/w"},"wait":false}`},
		{gfExec, `{"id":"sbx_1","input":{"command":["cat"],"stdin":"hi"},"wait":null}`},
		{gfExec, `{"id":"sbx_1","input":{"command":["cat"],"stdinBase64":"aGk="}}`},
		{gfExec, `{"id":"sbx_1","input":{"command":["cat"],"stdin":"a","stdinBase64":"aGk="}}`},
		{gfExec, `{"id":"sbx_1","input":{"command":["cat"],"stdinBase64":"aGk"}}`},
		{gfExec, `{"id":"sbx_1","input":{"command":"cat"}}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt","content":"x","mode":420}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt","b64":"eA==","mode":511}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt","content":"x","mode":512}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt","content":"x","mode":-1}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt"}`},
		{gfWrite, `{"id":"sbx_1","path":"a.txt","content":"x","b64":"eA=="}`},
		{gfWrite, `{"id":"","path":"","content":0}`},
		{gfAgent, `{"input":{"agentId":"opencode","instruction":"do it","sandboxId":"sbx_1","passAtK":1,"config":{"a":[1,{"b":null}]}}}`},
		{gfAgent, `{"input":{"agentId":"opencode","instruction":"x","sandboxId":"sbx_1","passAtK":0}}`},
		{gfAgent, `{"input":{"agentId":"opencode","instruction":"x","sandboxId":"sbx_1","config":null}}`},
		{gfList, `{"first":10,"after":"sbx_1","state":"RUNNING"}`},
		{gfList, `{"first":0}`},
		{gfList, `{"first":null,"state":"NOPE"}`},
		{gfListFiles, `{"id":"sbx_1","path":"a","first":5}`},
		{gfListFiles, `{"id":"sbx_1","path":"","first":-5}`},
		{gfSnapshots, `{"id":null,"first":3}`},
		{gfSnapshots, `{"first":0}`},
		{gfRead, `{"id":"sbx_1","path":"a","max":1}`},
		{gfRead, `{"id":"sbx_1","path":"a","max":10485761}`},
		{gfRead, `{"id":"sbx_1","path":"a","max":0}`},
		{gfRead, `{"id":"sbx_1","path":"a","max":9223372036854775807}`},
		{gfCreate, `{"input":{"labels":[{"key":"team","value":"ml"},{"key":"team","value":"x"}]}}`},
		{gfList, `{"labels":[{"key":"team","value":"ml"},{"key":"sandboxd.io/x","value":""}]}`},
		{gfUpdate, `{"id":"sbx_1","input":{"labels":[{"key":"team","value":"ml"},{"key":"old","value":null}],"clearLabels":true,"autostopSec":60,"ttlSec":7200}}`},
		{gfUpdate, `{"id":"sbx_1","input":{"labels":[{"key":"a","value":"1"},{"key":"a","value":null}]}}`},
		{gfUpdate, `{"id":"sbx_1","input":{"labels":null,"ttlSec":null}}`},
		{gfStdin, `{"id":"exec_1","data":"ls\n"}`},
		{gfStdin, `{"id":"exec_1","b64":"bHMK","close":true}`},
		{gfStdin, `{"id":"exec_1","data":"a","b64":"bHMK"}`},
		{gfStdin, `{"id":"exec_1","close":null}`},
		{gfExecs, `{"id":"sbx_1","state":"RUNNING","first":2,"after":"exec_1"}`},
		{gfExecs, `{"id":"sbx_1","state":"DONE","first":0}`},
	} {
		f.Add(s.op, []byte(s.vars))
	}

	svc := &gfService{}
	srv := handler.New(graph.NewExecutableSchema(graph.Config{Resolvers: &Resolver{svc: svc}}))
	srv.AddTransport(transport.POST{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](100))
	var problems []string
	srv.SetRecoverFunc(func(_ context.Context, v any) error {
		problems = append(problems, fmt.Sprintf("panic: %v", v))
		return errors.New("panic")
	})
	srv.SetErrorPresenter(func(ctx context.Context, err error) *gqlerror.Error {
		if ae, ok := errors.AsType[*apierror.Error](err); ok {
			if ae.Code != apierror.InvalidArgument {
				problems = append(problems, fmt.Sprintf("a resolver refused with %s, want INVALID_ARGUMENT: %v", ae.Code, err))
			}
		} else if _, ok := errors.AsType[*gqlerror.Error](err); !ok {
			problems = append(problems, fmt.Sprintf("an uncoded resolver error: %v", err))
		}
		return graphql.DefaultErrorPresenter(ctx, err)
	})
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{Key: "fuzz", Tenant: "t", Project: "p"})

	// The documents must still fit the schema: every operation's first seed reaches the service.
	for op, doc := range gfDocs {
		svc.calls = svc.calls[:0]
		problems = problems[:0]
		vars := map[uint8]string{gfCreate: `{"input":{}}`, gfExec: `{"id":"s","input":{"command":["x"]}}`,
			gfWrite: `{"id":"s","path":"p","content":""}`, gfAgent: `{"input":{"agentId":"a","instruction":"i","sandboxId":"s"}}`,
			gfList: `{}`, gfListFiles: `{"id":"s"}`, gfSnapshots: `{}`, gfRead: `{"id":"s","path":"p"}`,
			gfUpdate: `{"id":"s","input":{"ttlSec":5}}`,
			gfStdin:  `{"id":"e"}`, gfExecs: `{"id":"s"}`}[uint8(op)]
		if body := gfPost(f, srv, ctx, doc, []byte(vars)); len(svc.calls) != 1 || len(problems) > 0 {
			f.Fatalf("operation %d no longer reaches the service: %s %v", op, body, problems)
		}
	}

	f.Fuzz(func(t *testing.T, op uint8, vars []byte) {
		if len(vars) > 16<<10 || !json.Valid(vars) {
			return
		}
		op %= uint8(len(gfDocs))
		var v map[string]json.RawMessage
		if err := json.Unmarshal(vars, &v); err != nil {
			return // not an object: neither gqlgen nor the model decoding takes it
		}
		gfDirect(t, op, v)

		svc.calls = svc.calls[:0]
		problems = problems[:0]
		body := gfPost(t, srv, ctx, gfDocs[op], vars)
		if len(problems) > 0 {
			t.Fatalf("op %d, variables %s: %v (answer %s)", op, vars, problems, body)
		}
		for _, c := range svc.calls {
			gfCheckCall(t, op, v, c)
		}
	})
}

// The operations of FuzzGraphQLInputs (its op byte, modulo their number).
const (
	gfCreate uint8 = iota
	gfExec
	gfWrite
	gfAgent
	gfList
	gfListFiles
	gfSnapshots
	gfRead
	gfUpdate
	gfStdin
	gfExecs
)

var gfDocs = []string{
	gfCreate:    `mutation($input: CreateSandboxInput!) { createSandbox(input: $input) { sandbox { id } } }`,
	gfExec:      `mutation($id: ID!, $input: ExecInput!, $wait: Boolean) { exec(sandboxId: $id, input: $input, wait: $wait) { exec { execId } } }`,
	gfWrite:     `mutation($id: ID!, $path: String!, $content: String, $b64: String, $mode: Int) { writeFile(sandboxId: $id, path: $path, content: $content, contentBase64: $b64, mode: $mode) { file { path } } }`,
	gfAgent:     `mutation($input: StartAgentRunInput!) { startAgentRun(input: $input) { agentRun { id } } }`,
	gfList:      `query($first: Int, $after: String, $state: SandboxState, $labels: [LabelInput!]) { sandboxes(first: $first, after: $after, state: $state, labels: $labels) { pageInfo { hasNextPage } } }`,
	gfListFiles: `query($id: ID!, $path: String, $first: Int) { listFiles(sandboxId: $id, path: $path, first: $first) { path } }`,
	gfSnapshots: `query($id: ID, $first: Int) { snapshots(sandboxId: $id, first: $first) { nodes { id } } }`,
	gfRead:      `query($id: ID!, $path: String!, $max: Int64) { readFile(sandboxId: $id, path: $path, maxBytes: $max) { path } }`,
	gfUpdate:    `mutation($id: ID!, $input: UpdateSandboxInput!) { updateSandbox(id: $id, input: $input) { sandbox { id labels { key value } } } }`,
	gfStdin:     `mutation($id: ID!, $data: String, $b64: String, $close: Boolean) { writeExecStdin(execId: $id, data: $data, dataBase64: $b64, close: $close) { written } }`,
	gfExecs:     `query($id: ID!, $state: ExecState, $first: Int, $after: String) { execs(sandboxId: $id, state: $state, first: $first, after: $after) { pageInfo { hasNextPage } } }`,
}

func gfPost(tb testing.TB, srv http.Handler, ctx context.Context, doc string, vars []byte) []byte {
	tb.Helper()
	body, err := json.Marshal(map[string]any{"query": doc, "variables": json.RawMessage(vars)})
	if err != nil {
		tb.Fatal(err)
	}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec.Body.Bytes()
}

// gfDirect decodes the variables into the model inputs (as far as the schema lets them be:
// a list of EnvVarInput! holds no null) and checks the conversions.
func gfDirect(t *testing.T, op uint8, v map[string]json.RawMessage) {
	t.Helper()
	dec := func(name string, into any) bool {
		raw, ok := v[name]
		return !ok || json.Unmarshal(raw, into) == nil
	}
	switch op {
	case gfCreate:
		var in model.CreateSandboxInput
		if !dec("input", &in) || slices.Contains(in.Env, nil) {
			return
		}
		req, err := createRequest(in)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckCreate(t, in, req)
		}
	case gfExec:
		var in model.ExecInput
		var wait *bool
		if !dec("input", &in) || !dec("wait", &wait) || slices.Contains(in.Env, nil) {
			return
		}
		req, err := execRequest(in, wait)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckExec(t, in, wait, req)
		}
	case gfWrite:
		var content, b64 *string
		var mode *int
		if !dec("content", &content) || !dec("b64", &b64) || !dec("mode", &mode) {
			return
		}
		data, err := oneOf("content", content, "contentBase64", b64, true)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckContent(t, content, b64, data)
		}
		m, err := fileMode(mode)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckMode(t, mode, m)
		}
	case gfAgent:
		var in model.StartAgentRunInput
		if !dec("input", &in) {
			return
		}
		req, err := agentRunRequest(in)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckAgent(t, in.PassAtK, req)
		}
	case gfList:
		var first *int
		var after *string
		var state *model.SandboxState
		if !dec("first", &first) || !dec("after", &after) || !dec("state", &state) {
			return
		}
		opts, err := listOptions(first, after, state)
		gfCheckRefusal(t, err)
		if err == nil && (opts.Limit < 1 || opts.After != deref(after)) {
			t.Fatalf("listOptions(%v, %v): got %+v, want a positive limit and the cursor", first, after, opts)
		}
	case gfListFiles:
		var path *string
		var first *int
		if !dec("path", &path) || !dec("first", &first) {
			return
		}
		p, limit, err := listDirArgs(path, first)
		gfCheckRefusal(t, err)
		if err == nil && (limit < 1 || p == "") {
			t.Fatalf("listDirArgs(%v, %v): got %q, %d, want a path and a positive limit", path, first, p, limit)
		}
	case gfSnapshots:
		var first *int
		if !dec("first", &first) {
			return
		}
		n, err := pageSize(first)
		gfCheckRefusal(t, err)
		if err == nil && n < 1 {
			t.Fatalf("pageSize(%v) = %d, want a positive size", first, n)
		}
	case gfStdin:
		var data, b64 *string
		if !dec("data", &data) || !dec("b64", &b64) {
			return
		}
		got, err := oneOf("data", data, "dataBase64", b64, false)
		gfCheckRefusal(t, err)
		if err == nil && (data != nil || b64 != nil) {
			gfCheckContent(t, data, b64, got)
		}
	case gfExecs:
		var first *int
		var after *string
		var state *model.ExecState
		if !dec("first", &first) || !dec("after", &after) || !dec("state", &state) {
			return
		}
		opts, err := execListOptions(state, first, after)
		gfCheckRefusal(t, err)
		if err == nil && (opts.Limit < 1 || opts.After != deref(after)) {
			t.Fatalf("execListOptions(%v, %v): got %+v, want a positive limit and the cursor", first, after, opts)
		}
	case gfRead:
		var max *int64
		if !dec("max", &max) {
			return
		}
		n, err := readLimit(max)
		gfCheckRefusal(t, err)
		if err == nil && (n < 1 || n > maxReadFileBytes) {
			t.Fatalf("readLimit(%v) = %d, want 1 to %d", max, n, maxReadFileBytes)
		}
	case gfUpdate:
		var in model.UpdateSandboxInput
		if !dec("input", &in) || slices.Contains(in.Labels, nil) {
			return
		}
		req, err := updateRequest(in)
		gfCheckRefusal(t, err)
		if err == nil {
			gfCheckUpdate(t, in, req)
		}
	}
}

// gfCheckUpdate: every label patch entry given is in the patch (a null value a removal), none
// lost to a duplicate key; clearLabels and the durations as given.
func gfCheckUpdate(t *testing.T, in model.UpdateSandboxInput, req sandbox.UpdateRequest) {
	t.Helper()
	if len(req.Labels) != len(in.Labels) || (in.Labels == nil) != (req.Labels == nil) {
		t.Fatalf("%d label patches became %d: %v", len(in.Labels), len(req.Labels), req.Labels)
	}
	for _, l := range in.Labels {
		v, ok := req.Labels[l.Key]
		if !ok || (v == nil) != (l.Value == nil) || (v != nil && *v != *l.Value) {
			t.Fatalf("label patch %q=%v became %v (present %v)", l.Key, l.Value, v, ok)
		}
	}
	if !gfSameInt(in.AutostopSec, req.AutostopSec) || !gfSameInt(in.TTLSec, req.TTLSec) ||
		req.ClearLabels != (in.ClearLabels != nil && *in.ClearLabels) {
		t.Fatalf("updateRequest(%+v) = %+v, want the durations and clearLabels given", in, req)
	}
}

// gfCheckLabels: every label given is in the map, none lost to a duplicate key.
func gfCheckLabels(t *testing.T, in []*model.LabelInput, labels map[string]string) {
	t.Helper()
	if len(labels) != len(in) || (in == nil) != (labels == nil) {
		t.Fatalf("%d labels became %d: %v", len(in), len(labels), labels)
	}
	for _, l := range in {
		if v, ok := labels[l.Key]; !ok || v != l.Value {
			t.Fatalf("label %q=%q became %q (present %v)", l.Key, l.Value, v, ok)
		}
	}
}

// gfCheckRefusal: a conversion refuses with INVALID_ARGUMENT.
func gfCheckRefusal(t *testing.T, err error) {
	t.Helper()
	if err != nil && apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Fatalf("a conversion refused with %v, want INVALID_ARGUMENT", err)
	}
}

func gfCheckCreate(t *testing.T, in model.CreateSandboxInput, req sandbox.CreateRequest) {
	t.Helper()
	gfCheckEnv(t, in.Env, req.Env)
	gfCheckLabels(t, in.Labels, req.Labels)
	if !gfSameInt(in.AutostopSec, req.AutostopSec) || !gfSameInt(in.TTLSec, req.TTLSec) || req.Profile != deref(in.Profile) {
		t.Fatalf("createRequest(%+v) = %+v, want the profile and durations given", in, req)
	}
	if (in.Source == nil) != (req.Source == nil) {
		t.Fatalf("createRequest: source %+v became %+v", in.Source, req.Source)
	}
}

func gfCheckExec(t *testing.T, in model.ExecInput, wait *bool, req sandbox.ExecRequest) {
	t.Helper()
	gfCheckEnv(t, in.Env, req.Env)
	if !slices.Equal(in.Command, req.Command) || req.Cwd != deref(in.Cwd) || !gfSameInt(in.TimeoutSec, req.TimeoutSec) {
		t.Fatalf("execRequest(%+v) = %+v, want the command, cwd and timeout given", in, req)
	}
	if want := wait != nil && !*wait; req.Detach != want {
		t.Fatalf("execRequest with wait %v: detach %v, want %v", wait, req.Detach, want)
	}
	if in.Stdin == nil && in.StdinBase64 == nil {
		if len(req.Stdin) != 0 {
			t.Fatalf("execRequest without stdin: got stdin %q", req.Stdin)
		}
		return
	}
	gfCheckContent(t, in.Stdin, in.StdinBase64, req.Stdin)
}

// gfCheckEnv: every variable given is in the map, none lost to a duplicate name.
func gfCheckEnv(t *testing.T, in []*model.EnvVarInput, env map[string]string) {
	t.Helper()
	if len(env) != len(in) || (in == nil) != (env == nil) {
		t.Fatalf("%d variables became %d: %v", len(in), len(env), env)
	}
	for _, e := range in {
		if v, ok := env[e.Name]; !ok || v != e.Value {
			t.Fatalf("variable %q=%q became %q (present %v)", e.Name, e.Value, v, ok)
		}
	}
}

// gfCheckContent: data is the text, or the base64 decoded; exactly one of them was given.
func gfCheckContent(t *testing.T, text, b64 *string, data []byte) {
	t.Helper()
	switch {
	case text != nil && b64 != nil:
		t.Fatalf("accepted both %q and base64 %q", *text, *b64)
	case text != nil:
		if string(data) != *text {
			t.Fatalf("text %q became %q", *text, data)
		}
	case b64 != nil:
		want, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil || !bytes.Equal(want, data) {
			t.Fatalf("base64 %q became %q (decodes to %q, %v)", *b64, data, want, err)
		}
	default:
		t.Fatalf("accepted neither text nor base64: got %q", data)
	}
}

func gfCheckMode(t *testing.T, mode *int, m os.FileMode) {
	t.Helper()
	if m&^os.ModePerm != 0 || (mode != nil && int(m) != *mode) || (mode == nil && m != 0) {
		t.Fatalf("mode %v became %o, want the permission bits given", mode, m)
	}
}

func gfCheckAgent(t *testing.T, passAtK *int, req sandbox.AgentRunRequest) {
	t.Helper()
	if (passAtK == nil && req.PassAtK != 0) || (passAtK != nil && (req.PassAtK < 1 || req.PassAtK != *passAtK)) {
		t.Fatalf("passAtK %v became %d, want at least 1 (0 when null)", passAtK, req.PassAtK)
	}
	if req.Config != nil {
		var obj map[string]any
		if err := json.Unmarshal(req.Config, &obj); err != nil || obj == nil {
			t.Fatalf("config became %q, not a JSON object", req.Config)
		}
	}
}

func gfSameInt(in *int, out *int64) bool {
	return (in == nil && out == nil) || (in != nil && out != nil && int64(*in) == *out)
}

// gfCheckCall checks what reached the service through gqlgen against the variables sent.
func gfCheckCall(t *testing.T, op uint8, v map[string]json.RawMessage, c gfCall) {
	t.Helper()
	var in struct {
		Input json.RawMessage `json:"input"`
	}
	in.Input = v["input"]
	switch arg := c.arg.(type) {
	case sandbox.CreateRequest:
		var m model.CreateSandboxInput
		if json.Unmarshal(in.Input, &m) == nil {
			gfCheckEnv(t, m.Env, arg.Env)
			gfCheckLabels(t, m.Labels, arg.Labels)
		}
	case sandbox.ExecRequest:
		var m model.ExecInput
		if json.Unmarshal(in.Input, &m) != nil {
			return
		}
		gfCheckEnv(t, m.Env, arg.Env)
		if m.Stdin != nil || m.StdinBase64 != nil {
			gfCheckContent(t, m.Stdin, m.StdinBase64, arg.Stdin)
		} else if len(arg.Stdin) != 0 {
			t.Fatalf("no stdin sent, the service got %q", arg.Stdin)
		}
		var wait *bool
		_ = json.Unmarshal(v["wait"], &wait)
		if want := wait != nil && !*wait; arg.Detach != want {
			t.Fatalf("wait %s: detach %v, want %v", v["wait"], arg.Detach, want)
		}
	case gfWriteArgs:
		var content, b64 *string
		// A variable that is no JSON string (a number, say) was coerced by gqlgen's own String
		// rule ("0" for 0), which this check does not repeat: it compares strings only.
		errC := unmarshalPresent(v["content"], &content)
		errB := unmarshalPresent(v["b64"], &b64)
		if errC == nil && errB == nil {
			gfCheckContent(t, content, b64, arg.data)
		}
		if arg.mode&^os.ModePerm != 0 {
			t.Fatalf("mode %s became %o, not permission bits only", v["mode"], arg.mode)
		}
	case sandbox.AgentRunRequest:
		var m model.StartAgentRunInput
		if json.Unmarshal(in.Input, &m) == nil {
			gfCheckAgent(t, m.PassAtK, arg)
		}
	case sandbox.ListOptions:
		if arg.Limit < 1 || (arg.State != "" && !model.SandboxState(arg.State).IsValid()) {
			t.Fatalf("the service got %+v, want a positive limit and a schema state", arg)
		}
		var labels []*model.LabelInput
		if json.Unmarshal(v["labels"], &labels) == nil && len(labels) > 0 && !slices.Contains(labels, nil) {
			for _, l := range labels {
				if got, ok := arg.Labels[l.Key]; !ok || got != l.Value {
					t.Fatalf("label filter %q=%q became %q (present %v)", l.Key, l.Value, got, ok)
				}
			}
			if err := sandbox.CheckLabelKey(labels[0].Key); err != nil {
				t.Fatalf("the service got a filter on %q: %v", labels[0].Key, err)
			}
		} else if arg.Labels != nil {
			t.Fatalf("no label filter sent, the service got %v", arg.Labels)
		}
	case sandbox.UpdateRequest:
		var m model.UpdateSandboxInput
		if json.Unmarshal(in.Input, &m) == nil {
			gfCheckUpdate(t, m, arg)
		}
	case gfStdinArgs:
		var data, b64 *string
		var closeAfter *bool
		_ = json.Unmarshal(v["data"], &data)
		_ = json.Unmarshal(v["b64"], &b64)
		_ = json.Unmarshal(v["close"], &closeAfter)
		if data != nil || b64 != nil {
			gfCheckContent(t, data, b64, arg.data)
		} else if len(arg.data) != 0 {
			t.Fatalf("no data sent, the service got %q", arg.data)
		}
		if want := closeAfter != nil && *closeAfter; arg.close != want {
			t.Fatalf("close %s: the service got %v", v["close"], arg.close)
		}
	case sandbox.ExecListOptions:
		if arg.Limit < 1 || (arg.State != "" && !model.ExecState(arg.State).IsValid()) {
			t.Fatalf("the service got %+v, want a positive limit and a schema state", arg)
		}
	case gfLimit:
		if arg.limit < 1 || (op == gfRead && arg.limit > maxReadFileBytes) || (op == gfListFiles && arg.path == "") {
			t.Fatalf("op %d: the service got %+v for %v", op, arg, v)
		}
	default:
		t.Fatalf("op %d: unexpected call %+v", op, c)
	}
}

type gfCall struct {
	verb string
	arg  any
}

type gfLimit struct {
	path  string
	limit int64
}

type gfWriteArgs struct {
	mode os.FileMode
	data []byte
}

// gfService records calls and answers them without error. It needs no lock: the fuzz
// function's calls run one at a time, and every resolver of a request has finished (the
// executor waits for those it runs concurrently) before ServeHTTP returns.
type gfService struct {
	calls []gfCall
}

var _ api.Service = (*gfService)(nil)

func (s *gfService) record(verb string, arg any) { s.calls = append(s.calls, gfCall{verb, arg}) }

func (s *gfService) Create(_ context.Context, _ auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	s.record("Create", req)
	return sandbox.Sandbox{ID: "sbx_1", State: sandbox.Running}, nil
}

func (s *gfService) Get(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id, State: sandbox.Running}, nil
}

func (s *gfService) List(_ context.Context, _ auth.Principal, opts sandbox.ListOptions) (sandbox.Page, error) {
	s.record("List", opts)
	return sandbox.Page{}, nil
}

func (s *gfService) Exec(_ context.Context, _ auth.Principal, _ string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	s.record("Exec", req)
	return sandbox.ExecResult{ExecID: "exec_1", State: sandbox.ExecEnded}, nil
}

func (s *gfService) GetExec(_ context.Context, _ auth.Principal, _, execID string, _ bool) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{ExecID: execID}, nil
}

func (s *gfService) ExecOutput(context.Context, auth.Principal, string, string) (<-chan sandbox.ExecEvent, error) {
	ch := make(chan sandbox.ExecEvent)
	close(ch)
	return ch, nil
}

func (s *gfService) ExecOutputStatus(ctx context.Context, p auth.Principal, sandboxID, execID, after string) (sandbox.ExecResult, <-chan sandbox.ExecEvent, error) {
	st, _ := s.GetExec(ctx, p, sandboxID, execID, false)
	ch, err := s.ExecOutput(ctx, p, execID, after)
	return st, ch, err
}

func (s *gfService) Stop(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id}, nil
}

func (s *gfService) Start(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id}, nil
}

func (s *gfService) Pause(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id, State: sandbox.Paused}, nil
}

func (s *gfService) Resume(_ context.Context, _ auth.Principal, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{ID: id}, nil
}

func (s *gfService) Destroy(_ context.Context, _ auth.Principal, id string) (sandbox.DestroyResult, error) {
	return sandbox.DestroyResult{Sandbox: sandbox.Sandbox{ID: id}}, nil
}

func (s *gfService) Update(_ context.Context, _ auth.Principal, id string, req sandbox.UpdateRequest) (sandbox.Sandbox, error) {
	s.record("Update", req)
	return sandbox.Sandbox{ID: id, State: sandbox.Running, Labels: map[string]string{"a": "1"}}, nil
}

func (s *gfService) ReadFile(_ context.Context, _ auth.Principal, _, path string, maxBytes int64) ([]byte, sandbox.FileInfo, error) {
	s.record("ReadFile", gfLimit{path, maxBytes})
	return nil, sandbox.FileInfo{Path: path}, nil
}

func (s *gfService) WriteFile(_ context.Context, _ auth.Principal, _, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error) {
	data, _ := io.ReadAll(r)
	s.record("WriteFile", gfWriteArgs{mode, data})
	return sandbox.FileInfo{Path: path}, nil
}

func (s *gfService) ListDir(_ context.Context, _ auth.Principal, _, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	s.record("ListDir", gfLimit{path, int64(limit)})
	return nil, false, nil
}

func (s *gfService) FilePage(_ context.Context, _ auth.Principal, _, path string, opts sandbox.FileListOptions) (sandbox.FilePage, error) {
	s.record("FilePage", gfLimit{path, int64(opts.Limit)})
	return sandbox.FilePage{}, nil
}

func (s *gfService) Profiles() []sandbox.Profile { return nil }

func (s *gfService) EventsCursor(context.Context, auth.Principal) (string, error) { return "0-0", nil }

func (s *gfService) Quota(context.Context, auth.Principal) (quota.Usage, error) {
	return quota.Usage{}, nil
}

func (s *gfService) EventsFunc(_ context.Context, _ auth.Principal, _, _ string, _ func(sandbox.Event) bool, ended func()) error {
	go ended()
	return nil
}

func (s *gfService) Snapshot(_ context.Context, _ auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	return sandbox.SnapshotInfo{SandboxID: id}, nil
}

func (s *gfService) ListSnapshots(_ context.Context, _ auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error) {
	s.record("ListSnapshots", gfLimit{"-", int64(limit)})
	return nil, nil
}

func (s *gfService) SnapshotPage(_ context.Context, _ auth.Principal, _ string, opts sandbox.SnapshotListOptions) (sandbox.SnapshotPage, error) {
	s.record("SnapshotPage", gfLimit{"-", int64(opts.Limit)})
	return sandbox.SnapshotPage{}, nil
}

func (s *gfService) DeleteSnapshot(context.Context, auth.Principal, string) error { return nil }

func (s *gfService) GetSnapshot(_ context.Context, _ auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	return sandbox.SnapshotInfo{ID: id}, nil
}

func (s *gfService) StartAgentRun(_ context.Context, _ auth.Principal, req sandbox.AgentRunRequest) (sandbox.AgentRun, error) {
	s.record("StartAgentRun", req)
	return sandbox.AgentRun{ID: "run_1", Status: sandbox.RunRunning}, nil
}

func (s *gfService) GetAgentRun(_ context.Context, _ auth.Principal, runID string) (sandbox.AgentRun, error) {
	return sandbox.AgentRun{ID: runID}, nil
}

func (s *gfService) ListAgentRuns(context.Context, auth.Principal, string) ([]sandbox.AgentRun, error) {
	return nil, nil
}

func (s *gfService) AgentRunPage(_ context.Context, _ auth.Principal, _ string, opts sandbox.AgentRunListOptions) (sandbox.AgentRunPage, error) {
	s.record("AgentRunPage", gfLimit{"-", int64(opts.Limit)})
	return sandbox.AgentRunPage{}, nil
}

func (s *gfService) CancelAgentRun(_ context.Context, _ auth.Principal, runID string) (sandbox.AgentRun, error) {
	return sandbox.AgentRun{ID: runID}, nil
}

func (s *gfService) AgentRunEvents(context.Context, auth.Principal, string, string) (<-chan sandbox.AgentRunEvent, error) {
	ch := make(chan sandbox.AgentRunEvent)
	close(ch)
	return ch, nil
}

// GraphQL never calls the methods below (REST does); they answer like the others.

func (s *gfService) OpenFile(_ context.Context, _ auth.Principal, _, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	s.record("OpenFile", path)
	return io.NopCloser(bytes.NewReader(nil)), sandbox.FileInfo{Path: path}, nil
}

func (s *gfService) Limits() sandbox.Limits { return sandbox.DefaultLimits() }

type gfStdinArgs struct {
	data  []byte
	close bool
}

func (s *gfService) ListExecs(_ context.Context, _ auth.Principal, _ string, opts sandbox.ExecListOptions) (sandbox.ExecPage, error) {
	s.record("ListExecs", opts)
	return sandbox.ExecPage{}, nil
}

func (s *gfService) SignalExec(_ context.Context, _ auth.Principal, _, execID, _ string) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{ExecID: execID, State: sandbox.ExecRunning}, nil
}

func (s *gfService) WriteStdin(_ context.Context, _ auth.Principal, _, _ string, data []byte, closeAfter bool) (sandbox.StdinResult, error) {
	s.record("WriteStdin", gfStdinArgs{append([]byte(nil), data...), closeAfter})
	return sandbox.StdinResult{Written: int64(len(data)), Closed: closeAfter}, nil
}

func (s *gfService) ResizeTty(_ context.Context, _ auth.Principal, _, execID string, size sandbox.TtySize) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{ExecID: execID, State: sandbox.ExecRunning, Tty: &size}, nil
}

// unmarshalPresent decodes raw into v when it is present; an absent value leaves v alone.
func unmarshalPresent(raw json.RawMessage, v any) error {
	if raw == nil {
		return nil
	}
	return json.Unmarshal(raw, v)
}
