package tests

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// TestRedisRebuild: Redis is a lookup, not the truth. After FLUSHALL of a real redis-server,
// and after a restart of sandboxd on its embedded Redis, sandboxes are found
// again from the runtime (since the embedded Redis keeps its data across restarts, the second
// case is a restart that loses nothing; TestRestartKeepsRedis checks what it keeps).
func TestRedisRebuild(t *testing.T) {
	t.Run("redis-server-flushall", func(t *testing.T) {
		e2e.RequireComponents(t)
		rs := redistest.Start(t)
		s := e2e.StartServer(t, e2e.ServerOptions{RedisURL: rs.URL})
		ctx := t.Context()
		t1, t2 := s.Client(client.WithAPIKey(e2e.KeyTenant1)), s.Client(client.WithAPIKey(e2e.KeyTenant2))
		id := newSandbox(ctx, t, s, t1, client.CreateRequest{Profile: "sandboxes-default"}, e2e.HdrTenant1).ID
		runVia(ctx, t, t1, id, []string{"bash", "-c", "echo kept > kept.txt"})
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // for Redis
		defer cancel()
		if err := rs.Client.FlushAll(rctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		if n, err := rs.Client.DBSize(rctx).Result(); err != nil || n != 0 {
			t.Fatalf("DBSIZE after FLUSHALL: got %d (%v), want 0", n, err)
		}
		if sb, err := t1.Get(ctx, id); err != nil || sb.State != client.StateRunning || sb.TenantID != "t1" {
			t.Errorf("GET after FLUSHALL: got %+v (%v), want t1's RUNNING sandbox", sb, err)
		}
		if p, err := t1.List(ctx, client.ListOptions{}); err != nil || !inPage(p, id) {
			t.Errorf("list after FLUSHALL: got no %s (%v), want it", id, err)
		}
		_, err := t2.Get(ctx, id)
		wantClientError(t, "GET as t2 after FLUSHALL", err, http.StatusNotFound, client.CodeNotFound)
		if out := runVia(ctx, t, t1, id, []string{"cat", "kept.txt"}); out != "kept\n" {
			t.Errorf("exec after FLUSHALL: got %q, want kept", out)
		}
		// Once more, then straight to a lifecycle verb.
		if err := rs.Client.FlushAll(rctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		if _, err := t1.Destroy(ctx, id); err != nil {
			t.Fatalf("DELETE after FLUSHALL: %v", err)
		}
		_, err = t1.Get(ctx, id)
		wantClientError(t, "GET after DELETE", err, http.StatusNotFound, client.CodeNotFound)
	})

	t.Run("embedded-restart", func(t *testing.T) {
		sd := e2e.NewStateDir(t)
		a := e2e.StartServer(t, e2e.ServerOptions{State: sd})
		ctx, ac := t.Context(), a.Client(client.WithAPIKey(e2e.KeyTenant1))
		id := newSandbox(ctx, t, a, ac, client.CreateRequest{Profile: "sandboxes-default"}, e2e.HdrTenant1).ID
		runVia(ctx, t, ac, id, []string{"bash", "-c", "echo before restart > kept.txt"})
		a.Stop(t) // the sandboxes keep running
		if ids, err := e2e.LeftoverContainers(sd.Dir); err != nil || !slices.Contains(ids, id) {
			t.Fatalf("runsc list after sandboxd stopped: got %v (%v), want %s still running", ids, err, id)
		}
		b := e2e.StartServer(t, e2e.ServerOptions{State: sd})
		b.Track(id, e2e.HdrTenant1)
		bc := b.Client(client.WithAPIKey(e2e.KeyTenant1))
		if sb, err := bc.Get(ctx, id); err != nil || sb.State != client.StateRunning {
			t.Errorf("GET after restart: got state %q (%v), want RUNNING", sb.State, err)
		}
		if p, err := bc.List(ctx, client.ListOptions{}); err != nil || !inPage(p, id) {
			t.Errorf("list after restart: got no %s (%v), want it", id, err)
		}
		if out := runVia(ctx, t, bc, id, []string{"cat", "kept.txt"}); out != "before restart\n" {
			t.Errorf("exec after restart: got %q, want the file written before", out)
		}
		if _, err := bc.Destroy(ctx, id); err != nil {
			t.Fatalf("DELETE after restart: %v", err)
		}
	})
}

// TestTwoReplicas: two sandboxd processes on one Redis and one state folder serve the same
// sandbox; any verb works on either, and neither keeps state the other needs.
func TestTwoReplicas(t *testing.T) {
	e2e.RequireComponents(t)
	rs := redistest.Start(t)
	reps := e2e.Replicas(t, rs.URL, 2)
	ctx := t.Context()
	a, b := reps[0].Client(client.WithAPIKey(e2e.KeyTenant1)), reps[1].Client(client.WithAPIKey(e2e.KeyTenant1))
	id := newSandbox(ctx, t, reps[0], a, client.CreateRequest{Profile: "sandboxes-default"}, e2e.HdrTenant1).ID
	reps[1].Track(id, e2e.HdrTenant1)

	e2e.Step(t, "read-and-exec-on-the-other", func(t *testing.T) {
		if sb, err := b.Get(ctx, id); err != nil || sb.State != client.StateRunning {
			t.Errorf("GET on b: got state %q (%v), want RUNNING", sb.State, err)
		}
		runVia(ctx, t, b, id, []string{"bash", "-c", "echo written on b > shared.txt"})
		if out := runVia(ctx, t, a, id, []string{"cat", "shared.txt"}); out != "written on b\n" {
			t.Errorf("exec on a: got %q, want b's file", out)
		}
	})
	e2e.Step(t, "stop-on-b-start-on-a", func(t *testing.T) {
		if _, err := b.Stop(ctx, id); err != nil {
			t.Fatalf("stop on b: %v", err)
		}
		if sb, err := a.Get(ctx, id); err != nil || sb.State != client.StateStopped {
			t.Errorf("GET on a after b stopped it: got state %q (%v), want STOPPED", sb.State, err)
		}
		_, err := a.Exec(ctx, id, client.ExecRequest{Command: []string{"true"}})
		wantClientError(t, "exec on a while stopped", err, http.StatusConflict, client.CodeInvalidState)
		if _, err := a.Start(ctx, id); err != nil {
			t.Fatalf("start on a: %v", err)
		}
		// b attached to the box before it was stopped: it must attach to the new one.
		if out := runVia(ctx, t, b, id, []string{"cat", "shared.txt"}); out != "written on b\n" {
			t.Errorf("exec on b after a restarted the box: got %q, want the file", out)
		}
	})
	e2e.Step(t, "concurrent-stop", func(t *testing.T) {
		// Both replicas are asked to stop at once: one wins, the other answers 409, never 500.
		results := make(chan error, 2)
		for _, c := range []*client.Client{a, b} {
			go func() {
				_, err := c.Stop(ctx, id)
				results <- err
			}()
		}
		var codes []int
		for range 2 {
			status := http.StatusOK
			err := <-results
			if err != nil {
				status = -1
				if e, ok := errors.AsType[*client.Error](err); ok {
					status = e.Status
				}
			}
			codes = append(codes, status)
			if status != http.StatusOK && status != http.StatusConflict {
				t.Errorf("stop: got status %d (%v), want 200 or 409", status, err)
			}
		}
		if !slices.Contains(codes, http.StatusOK) {
			t.Errorf("got statuses %v, want one 200", codes)
		}
		if sb, err := a.Get(ctx, id); err != nil || sb.State != client.StateStopped {
			t.Errorf("got state %q (%v), want STOPPED", sb.State, err)
		}
	})
	e2e.Step(t, "destroy-on-b", func(t *testing.T) {
		if _, err := b.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy on b: %v", err)
		}
		_, err := a.Get(ctx, id)
		wantClientError(t, "GET on a after b destroyed it", err, http.StatusNotFound, client.CodeNotFound)
	})
}
