package tests

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

// TestClient drives the built server with the public Go client the way a Go user does:
// create → exec → follow a detached command's output (REST SSE and GraphQL WebSocket) →
// stop → start → destroy.
func TestClient(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	c := s.Client(client.WithAPIKey(e2e.KeyTenant1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	sb, err := c.Create(ctx, client.CreateRequest{Profile: "sandboxes-default", AutostopSec: client.Ptr[int64](1800)})
	if err != nil {
		t.Fatal(err)
	}
	s.Track(sb.ID, e2e.HdrTenant1)
	if sb.State != client.StateRunning || sb.AutostopSec != 1800 {
		t.Fatalf("got %+v, want RUNNING with autostop 1800", sb)
	}

	e2e.Step(t, "exec", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: []string{"bash", "-c", "cat; echo err >&2"}, Stdin: []byte("in\n")})
		if err != nil || res.ExitCode != 0 || res.Stdout != "in\n" || res.Stderr != "err\n" {
			t.Fatalf("got %+v, %v, want exit 0, stdout in, stderr err", res, err)
		}
	})

	const script = `for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done; exit 7`
	var execID string
	e2e.Step(t, "output-stream-rest", func(t *testing.T) {
		st, err := c.ExecDetached(ctx, sb.ID, client.ExecRequest{Command: []string{"bash", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		execID = st.ExecID
		out, err := c.ExecOutput(ctx, sb.ID, execID, "")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		var got strings.Builder
		exit := -1
		for {
			ev, err := out.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch ev.Kind {
			case client.KindChunk:
				got.Write(ev.Data)
			case client.KindExit:
				exit = ev.Exec.ExitCode
			}
		}
		if want := "line 1\nline 2\nline 3\nline 4\nline 5\n"; got.String() != want || exit != 7 {
			t.Errorf("got output %q and exit %d, want %q and 7", got.String(), exit, want)
		}
	})

	e2e.Step(t, "output-stream-graphql-resumes-after-a-cursor", func(t *testing.T) {
		sub, err := c.SubscribeExecOutput(ctx, execID, "")
		if err != nil {
			t.Fatal(err)
		}
		first, err := sub.Next()
		sub.Close()
		if err != nil || first.Kind != "CHUNK" {
			t.Fatalf("got %+v, %v, want a chunk", first, err)
		}
		sub, err = c.SubscribeExecOutput(ctx, execID, first.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		got := string(first.Data)
		for {
			ev, err := sub.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got += string(ev.Data)
		}
		if want := "line 1\nline 2\nline 3\nline 4\nline 5\n"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})

	e2e.Step(t, "stop-start-destroy", func(t *testing.T) {
		if got, err := c.Stop(ctx, sb.ID); err != nil || got.State != client.StateStopped || got.LatestSnapshotID == "" {
			t.Fatalf("stop: got %+v, %v, want STOPPED with a snapshot", got, err)
		}
		if got, err := c.Start(ctx, sb.ID); err != nil || got.State != client.StateRunning {
			t.Fatalf("start: got %+v, %v, want RUNNING", got, err)
		}
		if got, err := c.Destroy(ctx, sb.ID); err != nil || got.State != client.StateDestroyed {
			t.Fatalf("destroy: got %+v, %v, want DESTROYED", got, err)
		}
		if _, err := c.Get(ctx, sb.ID); !client.IsCode(err, client.CodeNotFound) && err != nil {
			t.Errorf("get after destroy: got %v, want NOT_FOUND or DESTROYED", err)
		}
	})
}

// The helpers of the scenarios that drive the public client (e2e.Server.Client).

// newSandbox creates a sandbox through c, wants the documented id and RUNNING, and tracks it for
// destruction with hdr, the header of c's key.
func newSandbox(ctx context.Context, t *testing.T, s *e2e.Server, c *client.Client, req client.CreateRequest, hdr string) client.Sandbox {
	t.Helper()
	sb, err := c.Create(ctx, req)
	if err != nil {
		t.Fatalf("create %+v: %v", req, err)
	}
	if !e2e.SandboxIDPattern.MatchString(sb.ID) {
		t.Fatalf("create: got sandbox id %q, want sbx_ and a ULID", sb.ID)
	}
	s.Track(sb.ID, hdr)
	if sb.State != client.StateRunning {
		t.Fatalf("create: got state %q, want RUNNING", sb.State)
	}
	return sb
}

// runVia runs argv (no shell, 60 s) through c and wants exit code 0; it returns stdout.
func runVia(ctx context.Context, t *testing.T, c *client.Client, id string, argv []string) string {
	t.Helper()
	res, err := c.Exec(ctx, id, client.ExecRequest{Command: argv, TimeoutSec: client.Ptr[int64](60)})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	if res.ExitCode != 0 || res.Signal != "" || res.TimedOut || res.Error != "" {
		t.Fatalf("exec %q: got exit %d signal %q timed_out %v error %q stderr %q, want exit 0",
			argv, res.ExitCode, res.Signal, res.TimedOut, res.Error, res.Stderr)
	}
	return res.Stdout
}

// wantClientError reports (without stopping the test) unless err is a *client.Error with this
// HTTP status and code and a message that mentions every one of mention (case-insensitively).
func wantClientError(t *testing.T, what string, err error, status int, code string, mention ...string) {
	t.Helper()
	e, ok := errors.AsType[*client.Error](err)
	switch {
	case !ok:
		t.Errorf("%s: got %v, want %d %s", what, err, status, code)
		return
	case e.Status != status || e.Code != code:
		t.Errorf("%s: got %d %s (%v), want %d %s", what, e.Status, e.Code, e, status, code)
		return
	case e.Message == "":
		t.Errorf("%s: got %d %s with an empty message", what, e.Status, e.Code)
		return
	}
	for _, m := range mention {
		if !strings.Contains(strings.ToLower(e.Message), strings.ToLower(m)) {
			t.Errorf("%s: got message %q, want it to mention %q", what, e.Message, m)
		}
	}
}

// inPage reports whether the page has the sandbox.
func inPage(p client.Page, id string) bool {
	return slices.ContainsFunc(p.Sandboxes, func(sb client.Sandbox) bool { return sb.ID == id })
}
