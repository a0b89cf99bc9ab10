package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestQuotaKillDuringCreate: a replica killed with SIGKILL in the middle of a create leaks no
// slot. Replicas on one Redis and state folder, lease_sec 3, a limit of 1: within one lease plus
// two reconcile intervals of the kill, replica B's in_use equals the sandboxes it lists as
// CREATING, STARTING or RUNNING (a box that never came up gave its slot back; one that did is
// listed and holds it rightly). Whatever is left settles, is destroyable, and the project's one
// slot can be taken again. Twice: a kill ~150 ms into the create (the box is being made), and
// a kill the moment the slot appears in Redis (before the box exists).
func TestQuotaKillDuringCreate(t *testing.T) {
	e2e.RequireComponents(t)
	const limit, leaseSec, reconcileMs = 1, 3, 500
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Extra: quotaConfig(limit, leaseSec, reconcileMs)}, 3)
	b := reps[2]
	k := killCase{rs: rs, b: b, limit: limit, lease: leaseSec * time.Second, reconcile: reconcileMs * time.Millisecond}

	t.Run("150ms-into-the-create", func(t *testing.T) {
		k.run(t, reps[0], func(began time.Time) {
			time.Sleep(time.Until(began.Add(150 * time.Millisecond)))
			// The kill is meant to land after the slot was taken: on a slow machine, wait for it.
			k.waitForSlot(t, 5*time.Second, time.Millisecond)
		})
	})
	t.Run("as-the-slot-is-taken", func(t *testing.T) {
		k.run(t, reps[1], func(time.Time) { k.waitForSlot(t, 5*time.Second, 0) })
	})
}

type killCase struct {
	rs               *redistest.Server
	b                *e2e.Server
	limit            int
	lease, reconcile time.Duration
}

// waitForSlot polls t1:p1's slots until one is taken.
func (k killCase) waitForSlot(t *testing.T, timeout, every time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, err := k.rs.Client.ZCard(context.Background(), slotsKeyT1).Result()
		if err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the create on A took no slot within %s (ZCARD %d, %v), want one", timeout, n, err)
		}
		if every > 0 {
			time.Sleep(every)
		}
	}
}

// run creates on a, kills a with SIGKILL when killAt returns, and checks what replica b sees.
func (k killCase) run(t *testing.T, a *e2e.Server, killAt func(began time.Time)) {
	b := k.b
	ctx := context.Background()
	// A create and destroy first, so that the killed create is not A's cold first request.
	warm := a.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	a.Curl(t, http.MethodDelete, e2e.Prefix+"/"+warm, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	if q := b.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Fatalf("before the kill: got in_use %d, want 0", q.InUse)
	}

	type answer struct {
		r   *e2e.Response
		err error
	}
	done := make(chan answer, 1)
	began := time.Now()
	go func() {
		r, err := a.Send(http.MethodPost, e2e.Prefix, strings.NewReader(e2e.CreateBody), e2e.HdrJSON, e2e.HdrTenant1)
		done <- answer{r, err}
	}()
	killAt(began)
	a.Kill(t)
	killedAt := time.Now()
	slotsAfterKill, _ := k.rs.Client.ZRange(ctx, slotsKeyT1, 0, -1).Result()
	ans := <-done
	switch {
	case ans.err != nil:
		t.Logf("the create on A was cut by SIGKILL %s after it began: %v", killedAt.Sub(began).Round(time.Millisecond), ans.err)
	case ans.r.Status == http.StatusCreated:
		var sb e2e.SandboxJSON
		if json.Unmarshal(ans.r.Body, &sb) == nil {
			b.Track(sb.SandboxID, e2e.HdrTenant1)
		}
		t.Logf("the create on A finished before the kill: %s", ans.r)
	default:
		t.Logf("the create on A answered before the kill: %s", ans.r)
	}
	t.Logf("slots of t1:p1 at the kill: %v; B lists: %s", slotsAfterKill, describe(b.ListAll(t, e2e.HdrTenant1).Sandboxes))

	// One lease plus two reconcile intervals after the kill.
	time.Sleep(time.Until(killedAt.Add(k.lease + 2*k.reconcile)))
	q, l := quotaAndHolders(t, b, e2e.HdrTenant1)
	h := slotHolders(l)
	t.Logf("%s after the kill, replica B: in_use %d of %d; listed: %s", time.Since(killedAt).Round(time.Millisecond), q.InUse, q.Limit, describe(l.Sandboxes))
	if q.InUse != len(h) {
		t.Errorf("%s after the kill (one lease of %s plus two reconcile intervals): got in_use %d on replica B, want %d, "+
			"the sandboxes B lists as CREATING, STARTING or RUNNING (%s)", time.Since(killedAt).Round(time.Millisecond),
			k.lease, q.InUse, len(h), describe(h))
	}

	// What A left half done is finished by B's reconciler once A's lock has lapsed.
	inFlight := func(l e2e.ListJSON) bool {
		for _, sb := range l.Sandboxes {
			switch sb.State {
			case "CREATING", "STARTING", "STOPPING", "DESTROYING":
				return true
			}
		}
		return false
	}
	// A's lock lapses within one lease; B's reconciler then finishes what A left.
	e2e.Eventually(t, 2*k.lease+6*k.reconcile, "every sandbox A left settles within about one lease", func() (bool, string) {
		l = b.ListAll(t, e2e.HdrTenant1)
		return !inFlight(l), describe(l.Sandboxes)
	})
	q, l = quotaAndHolders(t, b, e2e.HdrTenant1)
	h = slotHolders(l)
	t.Logf("%s after the kill, settled: in_use %d; listed: %s", time.Since(killedAt).Round(time.Millisecond), q.InUse, describe(l.Sandboxes))
	if q.InUse != len(h) {
		t.Errorf("after what A left settled: got in_use %d on replica B, want %d, its listed holders (%s)", q.InUse, len(h), describe(h))
	}
	for _, sb := range l.Sandboxes {
		b.Track(sb.SandboxID, e2e.HdrTenant1)
		r := b.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1)
		if r.Status != http.StatusOK {
			t.Errorf("destroying %s (%s) that A left: %s: got status %d, want 200", sb.SandboxID, sb.State, r, r.Status)
		}
	}
	if q := b.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying what A left: got in_use %d, want 0", q.InUse)
	}
	// The project's one slot is free: B can create.
	id := b.Create(t, e2e.CreateBody, e2e.HdrTenant1).SandboxID
	if q := b.Quota(t, e2e.HdrTenant1); q != (e2e.QuotaJSON{Limit: k.limit, InUse: 1}) {
		t.Errorf("after a create on B: got quota %+v, want in_use 1 of %d", q, k.limit)
	}
	b.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	if q := b.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
		t.Errorf("after destroying it: got in_use %d, want 0", q.InUse)
	}
}
