package tests

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"sandboxd/internal/redistest"
)

// TestRedisRebuild: Redis is a lookup, not the truth. After FLUSHALL of a real redis-server,
// and after a restart of sandboxd on its embedded Redis (a new, empty one), sandboxes are found
// again from the runtime.
func TestRedisRebuild(t *testing.T) {
	t.Run("redis-server-flushall", func(t *testing.T) {
		requireComponents(t)
		rs := redistest.Start(t)
		s := startServer(t, serverOptions{RedisURL: rs.URL})
		id := s.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1).SandboxID
		s.run(t, id, []string{"bash", "-c", "echo kept > kept.txt"}, hdrTenant1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		if n, err := rs.Client.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("DBSIZE after FLUSHALL: got %d (%v), want 0", n, err)
		}
		if sb := s.get(t, id, hdrTenant1); sb.State != "RUNNING" || sb.TenantID != "t1" {
			t.Errorf("GET after FLUSHALL: got %+v, want t1's RUNNING sandbox", sb)
		}
		if _, ok := s.list(t, hdrTenant1).find(id); !ok {
			t.Errorf("list after FLUSHALL: got no %s, want it", id)
		}
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrTenant2).wantError(t, http.StatusNotFound, "NOT_FOUND")
		if out := s.run(t, id, []string{"cat", "kept.txt"}, hdrTenant1); out != "kept\n" {
			t.Errorf("exec after FLUSHALL: got %q, want kept", out)
		}
		// Once more, then straight to a lifecycle verb.
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		r := s.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1)
		r.want(t, http.StatusOK)
		s.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrTenant1).wantError(t, http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("embedded-restart", func(t *testing.T) {
		sd := newStateDir(t)
		a := startServer(t, serverOptions{State: sd})
		id := a.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1).SandboxID
		a.run(t, id, []string{"bash", "-c", "echo before restart > kept.txt"}, hdrTenant1)
		a.Stop(t) // the sandboxes keep running
		if ids, err := leftoverContainers(sd.Dir); err != nil || !slices.Contains(ids, id) {
			t.Fatalf("runsc list after sandboxd stopped: got %v (%v), want %s still running", ids, err, id)
		}
		b := startServer(t, serverOptions{State: sd})
		b.track(id, hdrTenant1)
		if sb := b.get(t, id, hdrTenant1); sb.State != "RUNNING" {
			t.Errorf("GET after restart: got state %q, want RUNNING", sb.State)
		}
		if _, ok := b.list(t, hdrTenant1).find(id); !ok {
			t.Errorf("list after restart: got no %s, want it", id)
		}
		if out := b.run(t, id, []string{"cat", "kept.txt"}, hdrTenant1); out != "before restart\n" {
			t.Errorf("exec after restart: got %q, want the file written before", out)
		}
		r := b.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1)
		r.want(t, http.StatusOK)
	})
}

// TestTwoReplicas: two sandboxd processes on one Redis and one state folder serve the same
// sandbox; any verb works on either, and neither keeps state the other needs.
func TestTwoReplicas(t *testing.T) {
	requireComponents(t)
	rs := redistest.Start(t)
	reps := replicas(t, rs.URL, 2)
	a, b := reps[0], reps[1]
	id := a.create(t, `{"profile":"sandboxes-default"}`, hdrTenant1).SandboxID
	b.track(id, hdrTenant1)

	step(t, "read-and-exec-on-the-other", func(t *testing.T) {
		if sb := b.get(t, id, hdrTenant1); sb.State != "RUNNING" {
			t.Errorf("GET on b: got state %q, want RUNNING", sb.State)
		}
		b.run(t, id, []string{"bash", "-c", "echo written on b > shared.txt"}, hdrTenant1)
		if out := a.run(t, id, []string{"cat", "shared.txt"}, hdrTenant1); out != "written on b\n" {
			t.Errorf("exec on a: got %q, want b's file", out)
		}
	})
	step(t, "stop-on-b-start-on-a", func(t *testing.T) {
		b.curl(t, http.MethodPost, prefix+"/"+id+"/stop", nil, hdrTenant1).want(t, http.StatusOK)
		if sb := a.get(t, id, hdrTenant1); sb.State != "STOPPED" {
			t.Errorf("GET on a after b stopped it: got state %q, want STOPPED", sb.State)
		}
		a.curl(t, http.MethodPost, prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), hdrJSON, hdrTenant1).
			wantError(t, http.StatusConflict, "INVALID_STATE")
		a.curl(t, http.MethodPost, prefix+"/"+id+"/start", nil, hdrTenant1).want(t, http.StatusOK)
		// b attached to the box before it was stopped: it must attach to the new one.
		if out := b.run(t, id, []string{"cat", "shared.txt"}, hdrTenant1); out != "written on b\n" {
			t.Errorf("exec on b after a restarted the box: got %q, want the file", out)
		}
	})
	step(t, "concurrent-stop", func(t *testing.T) {
		// Both replicas are asked to stop at once: one wins, the other answers 409, never 500.
		results := make(chan *Response, 2)
		for _, s := range []*Server{a, b} {
			go func() {
				r, err := s.send(http.MethodPost, prefix+"/"+id+"/stop", nil, hdrTenant1)
				if err != nil {
					r = &Response{Status: -1, Body: []byte(err.Error()), Request: "POST stop"}
				}
				results <- r
			}()
		}
		var codes []int
		for range 2 {
			r := <-results
			codes = append(codes, r.Status)
			if r.Status != http.StatusOK && r.Status != http.StatusConflict {
				t.Errorf("%s: got status %d, want 200 or 409", r, r.Status)
			}
		}
		if !slices.Contains(codes, http.StatusOK) {
			t.Errorf("got statuses %v, want one 200", codes)
		}
		if sb := a.get(t, id, hdrTenant1); sb.State != "STOPPED" {
			t.Errorf("got state %q, want STOPPED", sb.State)
		}
	})
	step(t, "destroy-on-b", func(t *testing.T) {
		b.curl(t, http.MethodDelete, prefix+"/"+id, nil, hdrTenant1).want(t, http.StatusOK)
		a.curl(t, http.MethodGet, prefix+"/"+id, nil, hdrTenant1).wantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}
