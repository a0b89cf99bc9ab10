package tests

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestAutostopAndTTL: auto-stop and TTL end to end on runsc with short values (bounds 1 s,
// reconciler every 300 ms, a real redis-server). An idle sandbox with autostop_sec 2 stops by
// itself; one running `sleep 5` under autostop_sec 2 is not stopped before the command ends; one
// with ttl_sec 3 is destroyed (404) with a final EXPIRED event.
//
// The sandboxes are watched through the listing, never through GET on the sandbox: any API call
// on a sandbox is activity and would postpone its auto-stop.
func TestAutostopAndTTL(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL,
		Limits: map[string]any{"autostop_min_sec": 1, "ttl_min_sec": 1},
		Extra:  map[string]any{"reconcile_interval_ms": 300}})

	// watch lists the sandbox every 100 ms until until(sb) holds, failing after timeout. It
	// returns the sandbox that satisfied until and the states seen, with when (since from).
	watch := func(t *testing.T, id string, from time.Time, timeout time.Duration, each func(sb e2e.SandboxJSON), until func(sb e2e.SandboxJSON) bool) (e2e.SandboxJSON, []string) {
		t.Helper()
		var seen []string
		last := ""
		deadline := time.Now().Add(timeout)
		for {
			sb, ok := s.ListAll(t, e2e.HdrTenant1).Find(id)
			if !ok {
				t.Fatalf("the listing has no %s (states seen: %v), want it", id, seen)
			}
			if sb.State != last {
				seen = append(seen, sb.State+"@"+time.Since(from).Round(10*time.Millisecond).String())
				last = sb.State
			}
			if each != nil {
				each(sb)
			}
			if until(sb) {
				return sb, seen
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: got states %v within %s, want it to get further", id, seen, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("autostop-idle", func(t *testing.T) {
		before := time.Now()
		sb := s.Create(t, `{"profile":"sandboxes-default","autostop_sec":2}`, e2e.HdrTenant1)
		created := time.Now()
		if sb.AutostopSec != 2 {
			t.Errorf("got autostop_sec %d, want 2", sb.AutostopSec)
		}
		var shown *time.Time
		final, seen := watch(t, sb.SandboxID, created, 15*time.Second, func(sb e2e.SandboxJSON) {
			if sb.State == "RUNNING" && sb.AutostopAt != nil {
				shown = sb.AutostopAt
			}
			if sb.State != "RUNNING" && sb.State != "STOPPING" && sb.State != "STOPPED" {
				t.Errorf("got state %s (%s), want RUNNING, then STOPPING, then STOPPED", sb.State, sb.StateReason)
			}
		}, func(sb e2e.SandboxJSON) bool { return sb.State == "STOPPED" })
		stoppedAfter := time.Since(created)
		t.Logf("autostop_sec 2: states %v; STOPPED seen %s after the create answered", seen, stoppedAfter.Round(10*time.Millisecond))
		if shown == nil {
			t.Errorf("got no autostop_at while RUNNING, want one")
		} else {
			// The last activity is the create's: it became RUNNING between before and created.
			lo, hi := before.Add(2*time.Second-250*time.Millisecond), created.Add(2*time.Second+250*time.Millisecond)
			if shown.Before(lo) || shown.After(hi) {
				t.Errorf("got autostop_at %s, want the create's time plus 2s (between %s and %s)", shown.Format(time.RFC3339Nano), lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano))
			}
			if final.StateChangedAt.Before(*shown) {
				t.Errorf("got STOPPED at %s, want no earlier than autostop_at %s", final.StateChangedAt.Format(time.RFC3339Nano), shown.Format(time.RFC3339Nano))
			}
		}
		if stoppedAfter > 5500*time.Millisecond {
			t.Errorf("got STOPPED %s after the create, want within about 5s (autostop_sec 2, reconciler every 300ms)", stoppedAfter.Round(10*time.Millisecond))
		}
		if !strings.Contains(strings.ToLower(final.StateReason), "auto-stop") {
			t.Errorf("got state_reason %q, want it to mention auto-stop", final.StateReason)
		}
		if final.AutostopAt != nil {
			t.Errorf("got autostop_at %s on a STOPPED sandbox, want none", final.AutostopAt)
		}
		if q := s.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
			t.Errorf("after the auto-stop: got in_use %d, want 0 (a stop gives the slot back)", q.InUse)
		}
	})

	t.Run("autostop-waits-for-exec", func(t *testing.T) {
		sb := s.Create(t, `{"profile":"sandboxes-default","autostop_sec":2}`, e2e.HdrTenant1)
		id := sb.SandboxID
		type answer struct {
			r   *e2e.Response
			err error
		}
		done := make(chan answer, 1)
		execStart := time.Now()
		go func() {
			r, err := s.Send(http.MethodPost, e2e.Prefix+"/"+id+"/exec", strings.NewReader(`{"command":["sleep","5"],"timeout_sec":30}`), e2e.HdrJSON, e2e.HdrTenant1)
			done <- answer{r, err}
		}()
		// While the command runs (2.5 times autostop_sec) the sandbox stays RUNNING.
		var ans answer
		var seen []string
		polls := 0
	running:
		for {
			select {
			case ans = <-done:
				break running
			case <-time.After(200 * time.Millisecond):
			}
			sb, ok := s.ListAll(t, e2e.HdrTenant1).Find(id)
			polls++
			if !ok || sb.State != "RUNNING" {
				seen = append(seen, sb.State+"@"+time.Since(execStart).Round(10*time.Millisecond).String())
			}
		}
		execEnd := time.Now()
		if len(seen) > 0 {
			t.Errorf("during `sleep 5` under autostop_sec 2: got states %v, want RUNNING throughout (%d polls)", seen, polls)
		}
		if ans.err != nil {
			t.Fatalf("exec sleep 5: %v", ans.err)
		}
		ans.r.Want(t, http.StatusOK)
		var res e2e.ExecJSON
		ans.r.Decode(t, &res)
		if res.ExitCode != 0 || res.Signal != "" || res.TimedOut || res.Error != "" {
			t.Errorf("exec sleep 5 under autostop_sec 2: got exit %d signal %q timed_out %v error %q, want exit 0 (not killed by an auto-stop)",
				res.ExitCode, res.Signal, res.TimedOut, res.Error)
		}
		if res.DurationMs < 4900 {
			t.Errorf("exec sleep 5: got duration_ms %d, want at least 5000", res.DurationMs)
		}
		t.Logf("sleep 5 took %s (duration_ms %d), RUNNING in all %d polls", execEnd.Sub(execStart).Round(10*time.Millisecond), res.DurationMs, polls)
		// Once it ended, the countdown of autostop_sec starts: the command was activity until
		// its end. The reconciler sees a running command once per pass, so the idle time may
		// look up to one interval (300 ms) longer than it was; a stop seen earlier than that
		// came too soon.
		var leftRunning time.Duration
		final, states := watch(t, id, execEnd, 15*time.Second, func(sb e2e.SandboxJSON) {
			if sb.State != "RUNNING" && leftRunning == 0 {
				leftRunning = time.Since(execEnd)
			}
		}, func(sb e2e.SandboxJSON) bool {
			return sb.State != "RUNNING" && sb.State != "STOPPING"
		})
		stoppedAfter := time.Since(execEnd)
		t.Logf("after the exec: states %v", states)
		if final.State != "STOPPED" || !strings.Contains(strings.ToLower(final.StateReason), "auto-stop") {
			t.Fatalf("after the exec: got state %s (%q), want STOPPED by auto-stop", final.State, final.StateReason)
		}
		if earliest := 2*time.Second - 300*time.Millisecond - 100*time.Millisecond; leftRunning < earliest {
			t.Errorf("got the sandbox out of RUNNING %s after `sleep 5` ended, want no sooner than autostop_sec 2 "+
				"of no activity after it (at least %s, allowing one reconcile interval): a running command is activity until it ends",
				leftRunning.Round(10*time.Millisecond), earliest)
		}
		if stoppedAfter > 6*time.Second {
			t.Errorf("got STOPPED %s after the exec ended, want within about 2s plus a stop", stoppedAfter.Round(10*time.Millisecond))
		}
	})

	t.Run("ttl-expires", func(t *testing.T) {
		sb := s.Create(t, `{"profile":"sandboxes-default","ttl_sec":3}`, e2e.HdrTenant1)
		id := sb.SandboxID
		if sb.TTLSec != 3 {
			t.Errorf("got ttl_sec %d, want 3", sb.TTLSec)
		}
		expires := sb.CreatedAt.Add(3 * time.Second)
		if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(expires) {
			t.Errorf("got expires_at %v, want created_at + ttl_sec = %s", sb.ExpiresAt, expires.Format(time.RFC3339Nano))
		}
		if l, ok := s.ListAll(t, e2e.HdrTenant1).Find(id); !ok || l.ExpiresAt == nil || !l.ExpiresAt.Equal(expires) {
			t.Errorf("listing: got %s with expires_at %v, want %s", id, l.ExpiresAt, expires.Format(time.RFC3339Nano))
		}
		// The events of this sandbox from the start of the stream, over SSE.
		stream, closeStream := sse(t, s, e2e.HdrTenant1, map[string]any{"id": id, "after": "0-0"})
		defer closeStream()
		var goneAt time.Time
		for {
			r := s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1)
			if r.Status == http.StatusNotFound {
				goneAt = time.Now()
				break
			}
			r.Want(t, http.StatusOK)
			if time.Since(sb.CreatedAt) > 15*time.Second {
				var cur e2e.SandboxJSON
				r.Decode(t, &cur)
				t.Fatalf("%s with ttl_sec 3: still %s %s after its creation, want it gone", id, cur.State, time.Since(sb.CreatedAt).Round(10*time.Millisecond))
			}
			time.Sleep(100 * time.Millisecond)
		}
		gone := goneAt.Sub(sb.CreatedAt)
		t.Logf("ttl_sec 3: gone (404) %s after created_at", gone.Round(10*time.Millisecond))
		if goneAt.Before(expires) {
			t.Errorf("got 404 %s after created_at, want the sandbox kept until its ttl (3s) ended", gone.Round(10*time.Millisecond))
		}
		if gone > 7*time.Second {
			t.Errorf("got 404 %s after created_at, want within about 7s (ttl_sec 3, reconciler every 300ms)", gone.Round(10*time.Millisecond))
		}
		if _, ok := s.ListAll(t, e2e.HdrTenant1).Find(id); ok {
			t.Errorf("the listing still has %s after it expired, want it gone", id)
		}

		// The stream saw a final EXPIRED event.
		var events []string
		var expired *eventJSON
		timeout := time.After(20 * time.Second)
	read:
		for {
			select {
			case ev, ok := <-stream:
				if !ok {
					break read
				}
				if len(ev.Errors) > 0 || ev.Data.SandboxEvents == nil {
					t.Fatalf("SSE: got %+v, want an event", ev)
				}
				e := *ev.Data.SandboxEvents
				events = append(events, e.String())
				if expired != nil {
					t.Errorf("got event %s after the EXPIRED one, want EXPIRED last", e)
				}
				if e.State == "EXPIRED" {
					expired = &e
					// Anything after it would arrive promptly: wait a little, then stop.
					timeout = time.After(1500 * time.Millisecond)
				}
			case <-timeout:
				break read
			}
		}
		t.Logf("ttl_sec 3: events %v", events)
		if expired == nil {
			t.Fatalf("got events %v, want a final EXPIRED event", events)
		}
		if expired.SandboxID != id {
			t.Errorf("got the EXPIRED event of %s, want %s", expired.SandboxID, id)
		}
		if expired.Reason == nil || !strings.Contains(strings.ToLower(*expired.Reason), "ttl") {
			b, _ := json.Marshal(expired)
			t.Errorf("got EXPIRED event %s, want a reason that mentions the ttl", b)
		}
		if q := s.Quota(t, e2e.HdrTenant1); q.InUse != 0 {
			t.Errorf("after the expiry: got in_use %d, want 0 (expiry gives the slot back)", q.InUse)
		}
	})
}
