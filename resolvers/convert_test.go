package resolvers

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/graph/model"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// The schema's enum and the domain's states must name the same states.
func TestStatesMatchSchema(t *testing.T) {
	if len(sandbox.States) != len(model.AllSandboxState) {
		t.Fatalf("got %d domain states, %d schema states", len(sandbox.States), len(model.AllSandboxState))
	}
	for _, s := range sandbox.States {
		if !model.SandboxState(s).IsValid() {
			t.Errorf("domain state %s is not in the schema's SandboxState", s)
		}
	}
}

// TestSizesAreBytes: resources and profiles report exact bytes (Int64), not truncated MiB.
func TestSizesAreBytes(t *testing.T) {
	s := toSandbox(sandbox.Sandbox{MemoryBytes: 1<<20 + 1, DiskBytes: 64 << 30})
	if s.Resources.MemoryBytes != 1<<20+1 || s.Resources.DiskBytes != 64<<30 {
		t.Errorf("got %+v, want 1048577 and 68719476736 bytes", s.Resources)
	}
}

func TestExpiresAt(t *testing.T) {
	s := toSandbox(sandbox.Sandbox{CreatedAt: apitest.T0})
	if s.ExpiresAt != nil {
		t.Errorf("got expiresAt %v for no TTL, want null", s.ExpiresAt)
	}
	s = toSandbox(sandbox.Sandbox{CreatedAt: apitest.T0, TTLSec: 60})
	if s.ExpiresAt == nil || !s.ExpiresAt.Equal(apitest.T0.Add(time.Minute)) {
		t.Errorf("got expiresAt %v, want %v", s.ExpiresAt, apitest.T0.Add(time.Minute))
	}
}

func TestEmptyConnection(t *testing.T) {
	c := toConnection(sandbox.Page{})
	if len(c.Edges) != 0 || c.Edges == nil || c.Nodes == nil || c.PageInfo.HasNextPage || c.PageInfo.EndCursor != nil {
		t.Errorf("got %+v %+v, want empty lists and no cursors", c, c.PageInfo)
	}
}

// TestEmptyExecPageWithACursor: a page of execs a filter left empty, whose scan ran out of
// budget, says there is more and where it goes on.
func TestEmptyExecPageWithACursor(t *testing.T) {
	c := toExecConnection(sandbox.ExecPage{NextCursor: "exec_next"})
	if len(c.Edges) != 0 || !c.PageInfo.HasNextPage || c.PageInfo.EndCursor == nil || *c.PageInfo.EndCursor != "exec_next" {
		t.Errorf("got %+v %+v, want no edges, a next page and the cursor", c, c.PageInfo)
	}
	if c := toExecConnection(sandbox.ExecPage{}); c.PageInfo.HasNextPage || c.PageInfo.EndCursor != nil {
		t.Errorf("the last, empty page: got %+v, want no next page and no cursor", c.PageInfo)
	}
}

var eventsUser = auth.Principal{Key: "k1", Tenant: "t1", Project: "p1"}

// subscribeEvents stops, and closes its channel, when the subscriber's ctx ends even while the
// follower is blocked sending to a subscriber that does not read.
func TestSubscribeEventsStopsOnCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := apitest.New()
	f.SandboxEvents = []sandbox.Event{{Cursor: "1", Type: sandbox.EventStateChanged}}
	ctx, cancel := context.WithCancel(context.Background())
	out, err := subscribeEvents(ctx, f, eventsUser, "", "")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // let it block on the send
	cancel()
	for range out { // drains at most the one event, then sees the close
	}
	f.WaitStreams(t, 10*time.Second)
}

// A stream that ends while its subscriber lives broke off; events of an unknown kind are left
// out.
func TestSubscribeEventsEndsWithInput(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := apitest.New()
	f.SandboxEvents = []sandbox.Event{
		{Cursor: "1", Type: sandbox.EventStateChanged, State: sandbox.Running},
		{Cursor: "0", Type: "SOMETHING_NEW", State: sandbox.Running}, // a newer replica's: left out
		{Cursor: "2", Type: sandbox.EventStateChanged, State: sandbox.Stopping, PreviousState: sandbox.Running},
	}
	f.SandboxEventsEnd = true
	got, end := allEvents(t, f, "")
	if len(got) != 2 || got[0].PreviousState != nil || got[1].PreviousState == nil || *got[1].PreviousState != model.SandboxStateRunning {
		t.Errorf("got %+v, want two events, the first without a previous state", got)
	}
	if end.err == nil {
		t.Error("the stream ended while its subscriber lived, and did not break off")
	}
	f.WaitStreams(t, 10*time.Second)
}

// A sandbox's own stream ends after its DESTROYED event, complete (not broken off), and stops
// the follower: nothing after it is delivered.
func TestSubscribeEventsEndsAfterDestroyed(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := apitest.New()
	f.SandboxEvents = []sandbox.Event{
		{Cursor: "1", Type: sandbox.EventStateChanged, State: sandbox.Stopping},
		{Cursor: "2", Type: sandbox.EventStateChanged, State: sandbox.Destroyed},
		{Cursor: "3", Type: sandbox.EventStateChanged, State: sandbox.Running},
	}
	events, end := allEvents(t, f, apitest.SandboxRunning)
	var got []string
	for _, e := range events {
		got = append(got, e.Cursor)
	}
	if !slices.Equal(got, []string{"1", "2"}) || end.err != nil {
		t.Errorf("got cursors %v and end %v, want 1 and 2, no error", got, end.err)
	}
	f.WaitStreams(t, 10*time.Second)
}

// allEvents subscribes to f's events (sandboxID "": the project's) until the stream ends, and
// returns them with how it ended (a subscriber whose stream broke off has end.err set).
func allEvents(t *testing.T, f *apitest.Fake, sandboxID string) ([]*model.SandboxEvent, *streamEnd) {
	t.Helper()
	end := &streamEnd{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), streamEndKey{}, end))
	defer cancel()
	out, err := subscribeEvents(ctx, f, eventsUser, sandboxID, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []*model.SandboxEvent
	for e := range out {
		got = append(got, e)
	}
	return got, end
}

func TestBootstrapProgressEvent(t *testing.T) {
	ev := toEvent(sandbox.Event{Cursor: "1", Type: sandbox.EventBootstrapProgress, State: sandbox.Creating,
		Reason: "bootstrapping from https://files.example.com/…: 1.5 MB read", BytesRead: 1_500_000})
	if ev.BytesRead == nil || *ev.BytesRead != 1_500_000 || ev.Reason == nil || !strings.Contains(*ev.Reason, "1.5 MB") {
		t.Errorf("got %+v, want bytesRead 1500000 and the reason", ev)
	}
	if ev := toEvent(sandbox.Event{Cursor: "2", Type: sandbox.EventStateChanged, State: sandbox.Running}); ev.BytesRead != nil {
		t.Errorf("STATE_CHANGED: got bytesRead %d, want null", *ev.BytesRead)
	}
	// A bootstrap that has just begun has read nothing: 0, not null.
	if ev := toEvent(sandbox.Event{Cursor: "3", Type: sandbox.EventBootstrapProgress, State: sandbox.Creating}); ev.BytesRead == nil || *ev.BytesRead != 0 {
		t.Errorf("first BOOTSTRAP_PROGRESS: got %v, want bytesRead 0", ev.BytesRead)
	}
}

func TestValidUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"héllo", "héllo"},
		{"a\xffb", "a\uFFFDb"},
		{"\xff\xfe", "\uFFFD\uFFFD"},
		{"cut \xe2\x82", "cut \uFFFD\uFFFD"},
		{"\xef\xbf\xbd", "\uFFFD"},
	}
	for _, tt := range tests {
		if got := validUTF8([]byte(tt.in)); got != tt.want {
			t.Errorf("validUTF8(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

// The schema's exec enums and the domain's must name the same values.
func TestExecEnumsMatchSchema(t *testing.T) {
	for _, s := range []sandbox.ExecState{sandbox.ExecRunning, sandbox.ExecEnded} {
		if !model.ExecState(s).IsValid() {
			t.Errorf("domain exec state %s is not in the schema's ExecState", s)
		}
	}
	kinds := []sandbox.ExecEventKind{sandbox.ExecChunk, sandbox.ExecTruncated, sandbox.ExecExit}
	if len(kinds) != len(model.AllExecOutputKind) {
		t.Errorf("got %d domain event kinds, %d schema kinds", len(kinds), len(model.AllExecOutputKind))
	}
	for _, k := range kinds {
		if !model.ExecOutputKind(k).IsValid() {
			t.Errorf("domain event kind %s is not in the schema's ExecOutputKind", k)
		}
	}
}

func TestToExecResult(t *testing.T) {
	full := sandbox.ExecResult{ExecID: "exec_1", ExitCode: 0, Signal: "SIGKILL", TimedOut: true, Duration: time.Second,
		StartedAt: apitest.T0, EndedAt: apitest.T0.Add(time.Second), Error: "lost", OutputBytes: 7}
	tests := []struct {
		name      string
		state     sandbox.ExecState
		wantState model.ExecState
		wantExit  bool
	}{
		{name: "running", state: sandbox.ExecRunning, wantState: model.ExecStateRunning},
		{name: "ended", state: sandbox.ExecEnded, wantState: model.ExecStateEnded, wantExit: true},
		{name: "no-state-is-ended", state: "", wantState: model.ExecStateEnded, wantExit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := full
			r.State = tt.state
			got := toExecResult(r, nil)
			if got.State != tt.wantState || got.OutputBytes != 7 || got.StartedAt == nil {
				t.Errorf("got state %s outputBytes %d startedAt %v, want %s, 7 and set", got.State, got.OutputBytes, got.StartedAt, tt.wantState)
			}
			exit := got.ExitCode != nil && *got.ExitCode == 0 && got.DurationMs != nil && *got.DurationMs == 1000 &&
				got.EndedAt != nil && got.Signal != nil && got.Error != nil && got.TimedOut
			none := got.ExitCode == nil && got.DurationMs == nil && got.EndedAt == nil && got.Signal == nil &&
				got.Error == nil && !got.TimedOut
			if tt.wantExit && !exit {
				t.Errorf("got %+v, want every exit field set (exit code 0 included)", got)
			}
			if !tt.wantExit && !none {
				t.Errorf("got %+v, want the exit fields null and timedOut false", got)
			}
		})
	}
}

func TestToExecOutputEvent(t *testing.T) {
	tests := []struct {
		name string
		in   sandbox.ExecEvent
		want string
	}{
		{name: "text", in: sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "3-0", Stream: "stdout", Data: []byte("héllo")},
			want: `{"cursor":"3-0","kind":"CHUNK","stream":"STDOUT","data":"héllo","dataBase64":"aMOpbGxv"}`},
		{name: "empty-chunk", in: sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "3-0", Stream: "stderr"},
			want: `{"cursor":"3-0","kind":"CHUNK","stream":"STDERR","data":"","dataBase64":""}`},
		{name: "split-character", in: sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "2-0", Stream: "stdout", Data: []byte("h\xc3")},
			want: `{"cursor":"2-0","kind":"CHUNK","stream":"STDOUT","dataBase64":"aMM="}`},
		{name: "truncated-unknown", in: sandbox.ExecEvent{Kind: sandbox.ExecTruncated, Cursor: "9-0"},
			want: `{"cursor":"9-0","kind":"TRUNCATED","missedBytes":0}`},
		{name: "exit", in: sandbox.ExecEvent{Kind: sandbox.ExecExit, Cursor: "9-1", Result: &sandbox.ExecResult{ExecID: "exec_1",
			State: sandbox.ExecEnded, ExitCode: 1}},
			want: `{"cursor":"9-1","kind":"EXIT","result":{"id":"exec_1","execId":"exec_1","sandboxId":"","command":"","state":"ENDED","exitCode":1,` +
				`"timedOut":false,"durationMs":0,"outputBytes":0,"stdout":"","stderr":"","stdoutBase64":"","stderrBase64":"",` +
				`"stdoutTruncated":false,"stderrTruncated":false,"stdinOpen":false}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(toExecOutputEvent(tt.in, nil))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("got %s, want %s", b, tt.want)
			}
		})
	}
}

// forwardExecOutput ends after EXIT even when the service's channel stays open.
func TestForwardExecOutputEndsAfterExit(t *testing.T) {
	defer goleak.VerifyNone(t)
	in := make(chan sandbox.ExecEvent, 3)
	in <- sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "1-0", Stream: "stdout", Data: []byte("a")}
	in <- sandbox.ExecEvent{Kind: sandbox.ExecExit, Cursor: "1-1", Result: &sandbox.ExecResult{State: sandbox.ExecEnded}}
	in <- sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "2-0", Stream: "stdout", Data: []byte("never")}
	var got []string
	for e := range forwardExecOutput(context.Background(), in) {
		got = append(got, string(e.Kind))
	}
	if strings.Join(got, ",") != "CHUNK,EXIT" {
		t.Errorf("got %v, want CHUNK,EXIT", got)
	}
}
