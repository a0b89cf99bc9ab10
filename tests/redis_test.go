package tests

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestRedisRebuild: Redis is a lookup, not the truth. After FLUSHALL of a real redis-server,
// and after a restart of sandboxd on its embedded Redis (a new, empty one), sandboxes are found
// again from the runtime.
func TestRedisRebuild(t *testing.T) {
	t.Run("redis-server-flushall", func(t *testing.T) {
		e2e.RequireComponents(t)
		rs := redistest.Start(t)
		s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL})
		id := s.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
		s.Run(t, id, []string{"bash", "-c", "echo kept > kept.txt"}, e2e.HdrTenant1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		if n, err := rs.Client.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("DBSIZE after FLUSHALL: got %d (%v), want 0", n, err)
		}
		if sb := s.Get(t, id, e2e.HdrTenant1); sb.State != "RUNNING" || sb.TenantID != "t1" {
			t.Errorf("GET after FLUSHALL: got %+v, want t1's RUNNING sandbox", sb)
		}
		if _, ok := s.List(t, e2e.HdrTenant1).Find(id); !ok {
			t.Errorf("list after FLUSHALL: got no %s, want it", id)
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant2).WantError(t, http.StatusNotFound, "NOT_FOUND")
		if out := s.Run(t, id, []string{"cat", "kept.txt"}, e2e.HdrTenant1); out != "kept\n" {
			t.Errorf("exec after FLUSHALL: got %q, want kept", out)
		}
		// Once more, then straight to a lifecycle verb.
		if err := rs.Client.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		r := s.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("embedded-restart", func(t *testing.T) {
		sd := e2e.NewStateDir(t)
		a := e2e.StartServer(t, e2e.ServerOptions{State: sd})
		id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
		a.Run(t, id, []string{"bash", "-c", "echo before restart > kept.txt"}, e2e.HdrTenant1)
		a.Stop(t) // the sandboxes keep running
		if ids, err := e2e.LeftoverContainers(sd.Dir); err != nil || !slices.Contains(ids, id) {
			t.Fatalf("runsc list after sandboxd stopped: got %v (%v), want %s still running", ids, err, id)
		}
		b := e2e.StartServer(t, e2e.ServerOptions{State: sd})
		b.Track(id, e2e.HdrTenant1)
		if sb := b.Get(t, id, e2e.HdrTenant1); sb.State != "RUNNING" {
			t.Errorf("GET after restart: got state %q, want RUNNING", sb.State)
		}
		if _, ok := b.List(t, e2e.HdrTenant1).Find(id); !ok {
			t.Errorf("list after restart: got no %s, want it", id)
		}
		if out := b.Run(t, id, []string{"cat", "kept.txt"}, e2e.HdrTenant1); out != "before restart\n" {
			t.Errorf("exec after restart: got %q, want the file written before", out)
		}
		r := b.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1)
		r.Want(t, http.StatusOK)
	})
}

// TestTwoReplicas: two sandboxd processes on one Redis and one state folder serve the same
// sandbox; any verb works on either, and neither keeps state the other needs.
func TestTwoReplicas(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.Replicas(t, rs.URL, 2)
	a, b := reps[0], reps[1]
	id := a.Create(t, `{"profile":"sandboxes-default"}`, e2e.HdrTenant1).SandboxID
	b.Track(id, e2e.HdrTenant1)

	e2e.Step(t, "read-and-exec-on-the-other", func(t *testing.T) {
		if sb := b.Get(t, id, e2e.HdrTenant1); sb.State != "RUNNING" {
			t.Errorf("GET on b: got state %q, want RUNNING", sb.State)
		}
		b.Run(t, id, []string{"bash", "-c", "echo written on b > shared.txt"}, e2e.HdrTenant1)
		if out := a.Run(t, id, []string{"cat", "shared.txt"}, e2e.HdrTenant1); out != "written on b\n" {
			t.Errorf("exec on a: got %q, want b's file", out)
		}
	})
	e2e.Step(t, "stop-on-b-start-on-a", func(t *testing.T) {
		b.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		if sb := a.Get(t, id, e2e.HdrTenant1); sb.State != "STOPPED" {
			t.Errorf("GET on a after b stopped it: got state %q, want STOPPED", sb.State)
		}
		a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/exec", []byte(`{"command":["true"]}`), e2e.HdrJSON, e2e.HdrTenant1).
			WantError(t, http.StatusConflict, "INVALID_STATE")
		a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		// b attached to the box before it was stopped: it must attach to the new one.
		if out := b.Run(t, id, []string{"cat", "shared.txt"}, e2e.HdrTenant1); out != "written on b\n" {
			t.Errorf("exec on b after a restarted the box: got %q, want the file", out)
		}
	})
	e2e.Step(t, "concurrent-stop", func(t *testing.T) {
		// Both replicas are asked to stop at once: one wins, the other answers 409, never 500.
		results := make(chan *e2e.Response, 2)
		for _, s := range []*e2e.Server{a, b} {
			go func() {
				r, err := s.Send(http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrTenant1)
				if err != nil {
					r = &e2e.Response{Status: -1, Body: []byte(err.Error()), Request: "POST stop"}
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
		if sb := a.Get(t, id, e2e.HdrTenant1); sb.State != "STOPPED" {
			t.Errorf("got state %q, want STOPPED", sb.State)
		}
	})
	e2e.Step(t, "destroy-on-b", func(t *testing.T) {
		b.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		a.Curl(t, http.MethodGet, e2e.Prefix+"/"+id, nil, e2e.HdrTenant1).WantError(t, http.StatusNotFound, "NOT_FOUND")
	})
}
