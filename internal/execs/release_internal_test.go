package execs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"sandboxd/guest/client"
)

// TestReleaserGathersPerSandboxWithinItsBound: ended execs gather per sandbox in the order they
// ended, a take empties the releaser, and past maxReleasePending new ids are not gathered (their
// guests keep them within their own bounds) until a take makes room.
func TestReleaserGathersPerSandboxWithinItsBound(t *testing.T) {
	var r releaser
	r.add("sbx_a", "exec_1")
	r.add("sbx_b", "exec_2")
	r.add("sbx_a", "exec_3")
	got := r.take()
	if len(got) != 2 || !slices.Equal(got["sbx_a"], []string{"exec_1", "exec_3"}) || !slices.Equal(got["sbx_b"], []string{"exec_2"}) {
		t.Fatalf("take: %v", got)
	}
	if again := r.take(); len(again) != 0 {
		t.Fatalf("a second take: %v, want nothing", again)
	}
	for i := range maxReleasePending + 10 {
		r.add(fmt.Sprintf("sbx_%d", i%7), fmt.Sprintf("exec_%d", i))
	}
	n := 0
	for _, ids := range r.take() {
		n += len(ids)
	}
	if n != maxReleasePending {
		t.Fatalf("gathered %d ids, want the bound %d", n, maxReleasePending)
	}
	r.add("sbx_a", "exec_after")
	if got := r.take(); !slices.Equal(got["sbx_a"], []string{"exec_after"}) {
		t.Fatalf("after a take: %v", got)
	}
}

// guestRecorder is a Sandboxes whose Guest records the sandboxes asked for and answers none:
// sbx_stuck's call waits for its context (a sandbox whose PID 1 stopped), the others fail.
type guestRecorder struct {
	Sandboxes
	mu    sync.Mutex
	asked map[string]time.Time
}

func (g *guestRecorder) Guest(ctx context.Context, id string) (*client.Client, error) {
	g.mu.Lock()
	g.asked[id] = time.Now()
	g.mu.Unlock()
	if id == "sbx_stuck" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("no guest here")
}

// TestReleaseNowIsNotHeldByAStuckSandbox: a sandbox that does not answer holds one place for
// the call's timeout; every other sandbox's release is asked for meanwhile, and the round
// ends with the timeout.
func TestReleaseNowIsNotHeldByAStuckSandbox(t *testing.T) {
	old := releaseTimeout
	releaseTimeout = 500 * time.Millisecond
	t.Cleanup(func() { releaseTimeout = old })
	g := &guestRecorder{asked: map[string]time.Time{}}
	s := &Service{sandboxes: g, log: slog.New(slog.DiscardHandler)}
	s.bg, s.cancel = context.WithCancel(context.Background())
	defer s.cancel()
	s.released.add("sbx_stuck", "exec_0")
	for i := range 3 * releaseAtOnce {
		s.released.add(fmt.Sprintf("sbx_%d", i), fmt.Sprintf("exec_%d", i))
	}
	start := time.Now()
	s.releaseNow()
	took := time.Since(start)
	if len(g.asked) != 3*releaseAtOnce+1 {
		t.Fatalf("asked %d sandboxes, want %d", len(g.asked), 3*releaseAtOnce+1)
	}
	for id, at := range g.asked {
		if id != "sbx_stuck" && at.Sub(start) > 400*time.Millisecond {
			t.Errorf("%s was asked %v after the round began: it waited for the stuck sandbox", id, at.Sub(start))
		}
	}
	if took < releaseTimeout || took > 5*releaseTimeout {
		t.Errorf("the round took %v, want about the call's timeout %v", took, releaseTimeout)
	}
}
