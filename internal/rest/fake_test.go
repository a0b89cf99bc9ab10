package rest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "test-key"

// fakeService serves execs from memory. Methods the tests do not use panic (nil Service).
type fakeService struct {
	api.Service

	mu sync.Mutex
	// execs are the known execs, by id.
	execs map[string]sandbox.ExecResult
	// events are what ExecOutput sends, by exec id; gen, when set, makes them instead.
	events map[string][]sandbox.ExecEvent
	gen    func(ctx context.Context, ch chan<- sandbox.ExecEvent)
	// execResult answers Exec; execErr, outputErr fail Exec and ExecOutput.
	execResult sandbox.ExecResult
	execErr    error
	outputErr  error

	// snapshots answer Snapshot and ListSnapshots; snapshotErr fails them and DeleteSnapshot.
	snapshots   []sandbox.SnapshotInfo
	snapshotErr error

	// runs answer the agent run calls, by id; runErr fails them; runEvents is what
	// AgentRunEvents sends. runReqs and runAfters record StartAgentRun and AgentRunEvents.
	runs      map[string]sandbox.AgentRun
	runErr    error
	runEvents []sandbox.AgentRunEvent
	runReqs   []sandbox.AgentRunRequest
	runAfters []string

	// Recorded calls.
	createReqs []sandbox.CreateRequest
	// snapshotCalls are "Snapshot sbx_1", "ListSnapshots sbx_1 10", "DeleteSnapshot snap_1".
	snapshotCalls []string
	execReqs      []sandbox.ExecRequest
	afters        []string
	// outputs counts the ExecOutput goroutines still running; subscribed gets one value per
	// goroutine started.
	outputs    sync.WaitGroup
	subscribed chan struct{}
}

func newFake() *fakeService {
	return &fakeService{execs: map[string]sandbox.ExecResult{}, events: map[string][]sandbox.ExecEvent{},
		runs:       map[string]sandbox.AgentRun{},
		subscribed: make(chan struct{}, 100)}
}

func (f *fakeService) Create(_ context.Context, p auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.createReqs = append(f.createReqs, req)
	return sandbox.Sandbox{ID: sbx, Tenant: p.Tenant, Project: p.Project, State: sandbox.Running, CreatedAt: t0}, nil
}

func (f *fakeService) Snapshot(_ context.Context, _ auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapshotCalls = append(f.snapshotCalls, "Snapshot "+id)
	if f.snapshotErr != nil {
		return sandbox.SnapshotInfo{}, f.snapshotErr
	}
	return f.snapshots[0], nil
}

func (f *fakeService) ListSnapshots(_ context.Context, _ auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapshotCalls = append(f.snapshotCalls, fmt.Sprintf("ListSnapshots %s %d", sandboxID, limit))
	if f.snapshotErr != nil {
		return nil, f.snapshotErr
	}
	return f.snapshots, nil
}

func (f *fakeService) DeleteSnapshot(_ context.Context, _ auth.Principal, snapshotID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snapshotCalls = append(f.snapshotCalls, "DeleteSnapshot "+snapshotID)
	return f.snapshotErr
}

func (f *fakeService) Exec(_ context.Context, _ auth.Principal, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execReqs = append(f.execReqs, req)
	if f.execErr != nil {
		return sandbox.ExecResult{}, f.execErr
	}
	return f.execResult, nil
}

func (f *fakeService) GetExec(_ context.Context, _ auth.Principal, sandboxID, execID string, output bool) (sandbox.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res, ok := f.execs[execID]
	if !ok || (sandboxID != "" && sandboxID != res.SandboxID) {
		return sandbox.ExecResult{}, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	if !output {
		res.Stdout, res.Stderr = nil, nil
	}
	return res, nil
}

func (f *fakeService) ExecOutput(ctx context.Context, _ auth.Principal, execID, after string) (<-chan sandbox.ExecEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afters = append(f.afters, after)
	if f.outputErr != nil {
		return nil, f.outputErr
	}
	if after == "bad" {
		return nil, apierror.New(apierror.InvalidArgument, "after is not a cursor of this exec: %q", after)
	}
	if _, ok := f.execs[execID]; !ok && f.gen == nil {
		return nil, apierror.New(apierror.NotFound, "exec %s not found", execID)
	}
	evs := f.events[execID]
	// Replay after the cursor, like the domain service.
	for i, ev := range evs {
		if ev.Cursor == after {
			evs = evs[i+1:]
			break
		}
	}
	gen := f.gen
	ch := make(chan sandbox.ExecEvent)
	f.outputs.Add(1)
	f.subscribed <- struct{}{}
	go func() {
		defer f.outputs.Done()
		defer close(ch)
		if gen != nil {
			gen(ctx, ch)
			return
		}
		for _, ev := range evs {
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// waitOutputs waits for one subscription, then until every ExecOutput goroutine has ended
// (its subscription ended or cancelled).
func (f *fakeService) waitOutputs(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-f.subscribed:
	case <-time.After(d):
		t.Fatalf("no output subscription after %v, want one", d)
	}
	done := make(chan struct{})
	go func() {
		f.outputs.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("an output subscription still runs after %v, want it cancelled", d)
	}
}

func (f *fakeService) calls() ([]sandbox.ExecRequest, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sandbox.ExecRequest(nil), f.execReqs...), append([]string(nil), f.afters...)
}

// newTestHandler returns a handler over f that accepts testKey.
func newTestHandler(t *testing.T, f api.Service) *Handler {
	t.Helper()
	authn, err := auth.New([]auth.Key{{Name: "test", SHA256: auth.HashKey(testKey), Tenant: "t", Project: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	return New(f, authn, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
}

// sseEvent is one parsed Server-Sent Event (or comment, when Comment is set).
type sseEvent struct {
	ID, Event, Data, Comment string
}

// readEvents parses a stream until EOF or until stop returns true for an event.
func readEvents(t *testing.T, r io.Reader, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			out = append(out, cur)
			if stop != nil && stop(cur) {
				return out
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			cur.Comment = strings.TrimSpace(strings.TrimPrefix(line, ":"))
		default:
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				cur.ID = v
			case "event":
				cur.Event = v
			case "data":
				if cur.Data != "" {
					t.Errorf("event %q has two data lines, want one", cur.Event)
				}
				cur.Data = v
			default:
				t.Errorf("got line %q, want id, event, data or a comment", line)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return out
}

func newRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(auth.HeaderAPIKey, testKey)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

var (
	t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	t1 = t0.Add(54 * time.Millisecond)
)
