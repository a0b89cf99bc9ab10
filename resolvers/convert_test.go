package resolvers

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/graph/model"
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

func TestMiB(t *testing.T) {
	tests := []struct {
		bytes int64
		want  int
	}{{0, 0}, {1<<20 - 1, 0}, {1 << 20, 1}, {64 << 30, 65536}}
	for _, tt := range tests {
		if got := mib(tt.bytes); got != tt.want {
			t.Errorf("mib(%d): got %d, want %d", tt.bytes, got, tt.want)
		}
	}
}

func TestExpiresAt(t *testing.T) {
	s := toSandbox(sandbox.Sandbox{CreatedAt: t0})
	if s.ExpiresAt != nil {
		t.Errorf("got expiresAt %v for no TTL, want null", s.ExpiresAt)
	}
	s = toSandbox(sandbox.Sandbox{CreatedAt: t0, TTLSec: 60})
	if s.ExpiresAt == nil || !s.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("got expiresAt %v, want %v", s.ExpiresAt, t0.Add(time.Minute))
	}
}

func TestEmptyConnection(t *testing.T) {
	c := toConnection(sandbox.Page{})
	if len(c.Edges) != 0 || c.Edges == nil || c.Nodes == nil || c.PageInfo.HasNextPage || c.PageInfo.EndCursor != nil {
		t.Errorf("got %+v %+v, want empty lists and no cursors", c, c.PageInfo)
	}
}

// forwardEvents stops, and closes its channel, when the subscriber's ctx ends even while it
// is blocked sending to a subscriber that does not read.
func TestForwardEventsStopsOnCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	in := make(chan sandbox.Event, 1)
	in <- sandbox.Event{Cursor: "1"}
	ctx, cancel := context.WithCancel(context.Background())
	out := forwardEvents(ctx, in)
	time.Sleep(10 * time.Millisecond) // let it block on the send
	cancel()
	for range out { // drains at most the one event, then sees the close
	}
}

func TestForwardEventsEndsWithInput(t *testing.T) {
	defer goleak.VerifyNone(t)
	in := make(chan sandbox.Event, 2)
	in <- sandbox.Event{Cursor: "1", State: sandbox.Running}
	in <- sandbox.Event{Cursor: "2", State: sandbox.Stopping, PreviousState: sandbox.Running}
	close(in)
	var got []*model.SandboxEvent
	for e := range forwardEvents(context.Background(), in) {
		got = append(got, e)
	}
	if len(got) != 2 || got[0].PreviousState != nil || got[1].PreviousState == nil || *got[1].PreviousState != model.SandboxStateRunning {
		t.Errorf("got %+v, want two events, the first without a previous state", got)
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
