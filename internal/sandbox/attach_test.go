package sandbox_test

import (
	"context"
	"testing"
	"time"

	"sandboxd/internal/domain/domaintest"
)

// TestAttachAsksNoHealthOfARemoteDriver: on a driver that does not attach locally (the Fake,
// like Kubernetes, where each round trip crosses the API server) a replica's first attach asks
// no health call before the first real one: the handshake proved the init, and the health
// answer's only use, exec streams, needs a local attach. With the init stuck right after the
// handshake, Guest answers at once (a health call would wait out the dial's 15 s bound), and the
// first call is answered once the init goes on.
func TestAttachAsksNoHealthOfARemoteDriver(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	sb := e.CreateRunning(t, alice)
	e.Fake.Stick(sb.ID)
	stuck := true
	defer func() {
		if stuck {
			e.Fake.Unstick(sb.ID)
		}
	}()
	other := e.Replica(t) // no attach of its own yet
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	cl, err := other.Guest(ctx, sb.ID)
	if took := time.Since(start); err != nil || took > 5*time.Second {
		t.Fatalf("Guest on a stuck init: %v after %v, want a client at once", err, took)
	}
	e.Fake.Unstick(sb.ID)
	stuck = false
	if h, err := cl.Health(ctx); err != nil || !h.OK {
		t.Fatalf("the first call once the init goes on: %+v %v", h, err)
	}
}
