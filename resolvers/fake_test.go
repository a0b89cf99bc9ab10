package resolvers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
)

// Sandbox ids the fake knows. Anything else is NOT_FOUND.
const (
	idRunning = "sbx_01HZZZZZZZZZZZZZZZZZZZZZZZ"
	idBusy    = "sbx_busy"  // every verb: INVALID_STATE with Retry-After
	idBoom    = "sbx_boom"  // every verb: a plain (uncoded) error
	idPanic   = "sbx_panic" // every verb: a panic
)

// Exec ids the fake knows. Anything else is NOT_FOUND.
const (
	execEnded   = "exec_1" // ENDED with exit code 3
	execRunning = "exec_2" // RUNNING
	// badCursor is the cursor ExecOutput refuses with INVALID_ARGUMENT.
	badCursor = "nope"
)

// secretCause is the text of the fake's uncoded error; it must never reach a client.
const secretCause = "redis: dial tcp 10.0.0.7:6379: password=hunter2"

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func runningSandbox(p auth.Principal) sandbox.Sandbox {
	return sandbox.Sandbox{ID: idRunning, Tenant: p.Tenant, Project: p.Project, Profile: "sandboxes-default",
		State: sandbox.Running, CreatedAt: t0, StateChangedAt: t0.Add(time.Second), AutostopSec: 1800,
		TTLSec: 3600, MilliCPU: 2000, MemoryBytes: 4 << 30, DiskBytes: 10 << 30, Network: "none"}
}

// fakeService implements Service with canned answers and records what it was asked.
type fakeService struct {
	mu        sync.Mutex
	principal auth.Principal
	calls     []string
	listOpts  sandbox.ListOptions
	execReq   sandbox.ExecRequest
	create    sandbox.CreateRequest
	written   []byte
	mode      os.FileMode
	readMax   int64
	listPath  string
	listLimit int
	eventsArg [2]string
	// getExec is what GetExec was last asked.
	getExec getExecArgs
	// execOutputArg is what ExecOutput was last asked: exec id and cursor.
	execOutputArg [2]string
	// listSnapshots is what ListSnapshots was last asked: sandbox id and limit.
	listSnapshots struct {
		sandboxID string
		limit     int
	}
	// deleted is the snapshot DeleteSnapshot was last asked to delete.
	deleted string
	// agentReq is what StartAgentRun was last asked; agentEventsArg what AgentRunEvents was
	// last asked: run id and cursor.
	agentReq       sandbox.AgentRunRequest
	agentEventsArg [2]string

	// file is what ReadFile answers.
	file []byte
	// stdout is what Exec answers on stdout.
	stdout []byte
	// events are sent by Events; when endEvents is set the stream then ends, else it stays
	// open until the subscriber goes away.
	events    []sandbox.Event
	endEvents bool
	// eventsDelay is waited before the first event.
	eventsDelay time.Duration
	// eventsDone is closed when an Events producer has finished (its ctx ended or it ran out).
	eventsDone chan struct{}

	// execEvents are sent by ExecOutput, which then closes its channel (as the domain does
	// after EXIT). With execEndless it then sends CHUNKs of execChunk until its ctx ends.
	execEvents  []sandbox.ExecEvent
	execEndless bool
	execChunk   []byte
	// execDone receives how each ExecOutput producer ended.
	execDone chan execStreamEnd
}

type getExecArgs struct {
	sandboxID, execID string
	output            bool
}

// execStreamEnd is how an ExecOutput producer ended: the events it sent, and whether it sent
// them all and closed its channel (else the subscriber's ctx ended first).
type execStreamEnd struct {
	sent    int
	drained bool
}

func newFake() *fakeService {
	return &fakeService{eventsDone: make(chan struct{}, 16), execDone: make(chan execStreamEnd, 16)}
}

func (f *fakeService) record(p auth.Principal, call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.principal = p
	f.calls = append(f.calls, call)
}

func (f *fakeService) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeService) lastPrincipal() auth.Principal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.principal
}

// lookup answers the special ids.
func lookup(p auth.Principal, id string) (sandbox.Sandbox, error) {
	switch id {
	case idRunning:
		return runningSandbox(p), nil
	case idBusy:
		return sandbox.Sandbox{}, sandbox.Check(sandbox.Stopping, sandbox.VerbStart, id)
	case idBoom:
		return sandbox.Sandbox{}, errors.New(secretCause)
	case idPanic:
		panic("fake: " + secretCause)
	}
	return sandbox.Sandbox{}, apierror.New(apierror.NotFound, "sandbox %s not found", id)
}

func (f *fakeService) Create(_ context.Context, p auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	f.record(p, "Create")
	f.mu.Lock()
	f.create = req
	f.mu.Unlock()
	s := runningSandbox(p)
	if req.Profile != "" {
		s.Profile = req.Profile
	}
	return s, nil
}

func (f *fakeService) Get(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(p, "Get")
	return lookup(p, id)
}

func (f *fakeService) List(_ context.Context, p auth.Principal, opts sandbox.ListOptions) (sandbox.Page, error) {
	f.record(p, "List")
	f.mu.Lock()
	f.listOpts = opts
	f.mu.Unlock()
	a, b := runningSandbox(p), runningSandbox(p)
	b.ID = "sbx_01HYYYYYYYYYYYYYYYYYYYYYYY"
	return sandbox.Page{Sandboxes: []sandbox.Sandbox{a, b}, NextCursor: b.ID}, nil
}

func (f *fakeService) Exec(_ context.Context, p auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	f.record(p, "Exec")
	if _, err := lookup(p, id); err != nil {
		return sandbox.ExecResult{}, err
	}
	f.mu.Lock()
	f.execReq = req
	f.mu.Unlock()
	if req.Detach {
		return runningExec(id), nil
	}
	return sandbox.ExecResult{ExecID: execEnded, SandboxID: id, Command: "cat", State: sandbox.ExecEnded, ExitCode: 3,
		Duration: 1500 * time.Millisecond, StartedAt: t0, EndedAt: t0.Add(1500 * time.Millisecond), Stdout: f.stdout,
		Stderr: []byte("warn\n"), StdoutTruncated: true, OutputBytes: int64(len(f.stdout)) + 5}, nil
}

func runningExec(sandboxID string) sandbox.ExecResult {
	return sandbox.ExecResult{ExecID: execRunning, SandboxID: sandboxID, Command: "'sleep' '60'",
		State: sandbox.ExecRunning, StartedAt: t0, OutputBytes: 12}
}

func endedExec() *sandbox.ExecResult {
	return &sandbox.ExecResult{ExecID: execEnded, SandboxID: idRunning, Command: "'make' 'test'", State: sandbox.ExecEnded,
		ExitCode: 3, Duration: 1500 * time.Millisecond, StartedAt: t0, EndedAt: t0.Add(1500 * time.Millisecond), OutputBytes: 11}
}

func (f *fakeService) GetExec(_ context.Context, p auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error) {
	f.record(p, "GetExec")
	f.mu.Lock()
	f.getExec = getExecArgs{sandboxID: sandboxID, execID: execID, output: output}
	f.mu.Unlock()
	var res sandbox.ExecResult
	switch execID {
	case execEnded:
		res = *endedExec()
	case execRunning:
		res = runningExec(idRunning)
	default:
		return sandbox.ExecResult{}, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if output {
		res.Stdout, res.Stderr, res.StderrTruncated = []byte("hello\n"), []byte("oops\xff"), true
	}
	return res, nil
}

func (f *fakeService) ExecOutput(ctx context.Context, p auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error) {
	f.record(p, "ExecOutput")
	if execID != execEnded {
		return nil, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if after == badCursor {
		return nil, apierror.New(apierror.InvalidArgument, "bad cursor %q", after).WithDetail("field", "after")
	}
	f.mu.Lock()
	f.execOutputArg = [2]string{execID, after}
	evs, endless, chunk := append([]sandbox.ExecEvent(nil), f.execEvents...), f.execEndless, f.execChunk
	f.mu.Unlock()
	out := make(chan sandbox.ExecEvent)
	go func() {
		end := execStreamEnd{}
		defer func() { f.execDone <- end }()
		for _, e := range evs {
			select {
			case out <- e:
				end.sent++
			case <-ctx.Done():
				return
			}
		}
		for i := 0; endless; i++ {
			select {
			case out <- sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: fmt.Sprintf("%d-0", i), Stream: "stdout", Data: chunk}:
				end.sent++
			case <-ctx.Done():
				return
			}
		}
		close(out)
		end.drained = true
	}()
	return out, nil
}

func (f *fakeService) Stop(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(p, "Stop")
	s, err := lookup(p, id)
	s.State = sandbox.Stopped
	return s, err
}

func (f *fakeService) Start(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(p, "Start")
	return lookup(p, id)
}

func (f *fakeService) Destroy(_ context.Context, p auth.Principal, id string) (sandbox.DestroyResult, error) {
	f.record(p, "Destroy")
	s, err := lookup(p, id)
	s.State = sandbox.Destroyed
	return sandbox.DestroyResult{Sandbox: s, SnapshotID: "snap_9"}, err
}

func (f *fakeService) ReadFile(_ context.Context, p auth.Principal, id, path string, maxBytes int64) ([]byte, sandbox.FileInfo, error) {
	f.record(p, "ReadFile")
	if _, err := lookup(p, id); err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	f.mu.Lock()
	f.readMax = maxBytes
	f.mu.Unlock()
	if int64(len(f.file)) > maxBytes {
		return nil, sandbox.FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is too large", path)
	}
	return f.file, sandbox.FileInfo{Name: "a.txt", Path: "/workspace/" + path, Size: int64(len(f.file)), Mode: 0o644, ModTime: t0}, nil
}

func (f *fakeService) WriteFile(_ context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error) {
	f.record(p, "WriteFile")
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	f.mu.Lock()
	f.written, f.mode = data, mode
	f.mu.Unlock()
	return sandbox.FileInfo{Name: "b.bin", Path: "/workspace/" + path, Size: int64(len(data)), Mode: uint32(mode)}, nil
}

func (f *fakeService) ListDir(_ context.Context, p auth.Principal, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	f.record(p, "ListDir")
	if _, err := lookup(p, id); err != nil {
		return nil, false, err
	}
	f.mu.Lock()
	f.listPath, f.listLimit = path, limit
	f.mu.Unlock()
	return []sandbox.FileInfo{
		{Name: "src", Path: "/workspace/src", IsDir: true, Mode: 0o755, ModTime: t0},
		{Name: "link", Path: "/workspace/link", Symlink: "src", Mode: 0o777},
	}, true, nil
}

func (f *fakeService) OpenFile(_ context.Context, p auth.Principal, id, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	data, info, err := f.ReadFile(context.Background(), p, id, path, 1<<62)
	return io.NopCloser(bytes.NewReader(data)), info, err
}

func (f *fakeService) Limits() sandbox.Limits { return sandbox.DefaultLimits() }

func (f *fakeService) Quota(ctx context.Context, p auth.Principal) (quota.Usage, error) {
	return quota.Usage{Limit: 10, InUse: 3}, nil
}

func (f *fakeService) Profiles() []sandbox.Profile {
	f.record(auth.Principal{}, "Profiles")
	return []sandbox.Profile{{Name: "sandboxes-default", Description: "Debian with Python", MilliCPU: 2000,
		MemoryBytes: 4 << 30, DiskBytes: 10 << 30, Network: "none", Default: true}}
}

func (f *fakeService) Events(ctx context.Context, p auth.Principal, sandboxID, after string) (<-chan sandbox.Event, error) {
	f.record(p, "Events")
	if sandboxID != "" {
		if _, err := lookup(p, sandboxID); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	f.eventsArg = [2]string{sandboxID, after}
	evs, end, delay := append([]sandbox.Event(nil), f.events...), f.endEvents, f.eventsDelay
	f.mu.Unlock()
	out := make(chan sandbox.Event)
	go func() {
		defer func() { f.eventsDone <- struct{}{} }()
		defer close(out)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		for _, e := range evs {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
		if !end {
			<-ctx.Done()
		}
	}()
	return out, nil
}

// Snapshot ids the fake knows (of idRunning). Anything else is NOT_FOUND.
const (
	snapOld    = "snap_01HZZZZZZZZZZZZZZZZZZZZZZZ_0000000001"
	snapLatest = "snap_01HZZZZZZZZZZZZZZZZZZZZZZZ_0000000002" // DeleteSnapshot: INVALID_STATE
)

func fakeSnapshots() []sandbox.SnapshotInfo {
	return []sandbox.SnapshotInfo{
		{ID: snapLatest, SandboxID: idRunning, CreatedAt: t0.Add(time.Minute), SizeBytes: 5 << 30, RawSizeBytes: 6 << 30,
			SHA256: strings.Repeat("ab", 32), Parent: snapOld},
		{ID: snapOld, SandboxID: idRunning, CreatedAt: t0, SizeBytes: 100, RawSizeBytes: 2048, SHA256: strings.Repeat("cd", 32)},
	}
}

func (f *fakeService) Snapshot(_ context.Context, p auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	f.record(p, "Snapshot")
	if _, err := lookup(p, id); err != nil {
		return sandbox.SnapshotInfo{}, err
	}
	return fakeSnapshots()[0], nil
}

func (f *fakeService) ListSnapshots(_ context.Context, p auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error) {
	f.record(p, "ListSnapshots")
	if sandboxID != "" {
		if _, err := lookup(p, sandboxID); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	f.listSnapshots.sandboxID, f.listSnapshots.limit = sandboxID, limit
	f.mu.Unlock()
	return fakeSnapshots(), nil
}

func (f *fakeService) DeleteSnapshot(_ context.Context, p auth.Principal, snapshotID string) error {
	f.record(p, "DeleteSnapshot")
	switch snapshotID {
	case snapOld:
		f.mu.Lock()
		f.deleted = snapshotID
		f.mu.Unlock()
		return nil
	case snapLatest:
		return apierror.New(apierror.InvalidState, "cannot delete snapshot %s: it is the only copy", snapshotID).WithDetail("state", "STOPPED")
	}
	return apierror.New(apierror.NotFound, "snapshot %s not found", snapshotID)
}

// ---- harness ----

// Keys of the test Authenticator.
const (
	userKey     = "key-user"
	platformKey = "key-platform"
)

func testAuthenticator(t *testing.T) *auth.Authenticator {
	t.Helper()
	a, err := auth.New([]auth.Key{
		{Name: "user", SHA256: auth.HashKey(userKey), Tenant: "acme", Project: "web"},
		{Name: "platform", SHA256: auth.HashKey(platformKey), Tenant: "plat", Project: "ops", Platform: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	fake *fakeService
	srv  *httptest.Server
	logs *syncBuffer
}

func newEnv(t *testing.T, opts HandlerOptions) *env {
	t.Helper()
	return newEnvWith(t, opts, nil)
}

// newEnvWith lets configure adjust the http.Server before it starts.
func newEnvWith(t *testing.T, opts HandlerOptions, configure func(*http.Server)) *env {
	t.Helper()
	e := &env{fake: newFake(), logs: &syncBuffer{}}
	opts.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	mux := http.NewServeMux()
	mux.Handle("/graphql", NewHandler(e.fake, testAuthenticator(t), opts))
	mux.Handle("GET /graphiql", GraphiQLHandler())
	e.srv = httptest.NewUnstartedServer(mux)
	if configure != nil {
		configure(e.srv.Config)
	}
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// gqlResponse is a GraphQL response as a client sees it.
type gqlResponse struct {
	Status int
	Data   map[string]json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Path       []any          `json:"path"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

func (r gqlResponse) code(i int) string {
	if i >= len(r.Errors) {
		return ""
	}
	c, _ := r.Errors[i].Extensions["code"].(string)
	return c
}

// post sends a GraphQL request; key "" sends none. extra headers are name, value pairs.
func (e *env) post(t *testing.T, key, query string, vars map[string]any, extra ...string) gqlResponse {
	t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(auth.HeaderAPIKey, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	return e.do(t, req)
}

func (e *env) do(t *testing.T, req *http.Request) gqlResponse {
	t.Helper()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out gqlResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("response is not JSON (status %d): %s", resp.StatusCode, raw)
	}
	out.Status = resp.StatusCode
	return out
}

// field decodes data[name] into v.
func field(t *testing.T, r gqlResponse, name string, v any) {
	t.Helper()
	raw, ok := r.Data[name]
	if !ok {
		t.Fatalf("data has no %q: %+v", name, r)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("data.%s: %v (%s)", name, err, raw)
	}
}

func noErrors(t *testing.T, r gqlResponse) {
	t.Helper()
	if len(r.Errors) > 0 {
		t.Fatalf("got errors %+v, want none", r.Errors)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}
