package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewDefaultsFromEnvironment(t *testing.T) {
	t.Setenv(client.EnvGatewayURL, "http://gw.example:8780/")
	t.Setenv(client.EnvAPIKey, "k")
	c, err := client.New()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.BaseURL(), "http://gw.example:8780"; got != want {
		t.Errorf("got base URL %q, want %q", got, want)
	}
	t.Setenv(client.EnvAPIKey, "")
	if _, err := client.New(); err == nil {
		t.Error("got no error without an API key, want one")
	}
}

func TestSandboxLifecycle(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)

	sb, err := c.Create(ctx, client.CreateRequest{Profile: "big", AutostopSec: client.Ptr[int64](60), TTLSec: client.Ptr[int64](600),
		Env: map[string]string{"A": "1"}, Source: &client.Source{SnapshotID: apitest.SnapOld}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != apitest.SandboxRunning || sb.State != client.StateRunning || sb.Profile != "big" || sb.Resources.MilliCPU != 2000 {
		t.Errorf("got sandbox %+v, want %s RUNNING of profile big with 2000 milli-CPU", sb, apitest.SandboxRunning)
	}
	got := e.fake.Last("Create").Create
	if got.Profile != "big" || *got.AutostopSec != 60 || *got.TTLSec != 600 || got.Env["A"] != "1" || got.Source.SnapshotID != apitest.SnapOld {
		t.Errorf("the server got create %+v, want the request's fields", got)
	}

	page, err := c.List(ctx, client.ListOptions{State: "running", Limit: 2, Cursor: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Sandboxes) != 2 || page.NextCursor == "" {
		t.Errorf("got page %+v, want 2 sandboxes and a next cursor", page)
	}
	if opts := e.fake.Last("List").List; opts.Limit != 2 || opts.After != "c1" || opts.State != sandbox.Running {
		t.Errorf("the server got list options %+v, want limit 2 after c1 state RUNNING", opts)
	}
	q, err := c.Quota(ctx)
	if err != nil || q != (client.Quota{Limit: 10, InUse: 3}) {
		t.Errorf("got quota %+v, %v, want 3 of 10", q, err)
	}
	for _, step := range []struct {
		name string
		do   func() (client.Sandbox, error)
	}{
		{"get", func() (client.Sandbox, error) { return c.Get(ctx, sb.ID) }},
		{"stop", func() (client.Sandbox, error) { return c.Stop(ctx, sb.ID) }},
		{"start", func() (client.Sandbox, error) { return c.Start(ctx, sb.ID) }},
	} {
		if got, err := step.do(); err != nil || got.ID != sb.ID {
			t.Errorf("%s: got %+v, %v, want sandbox %s", step.name, got, err, sb.ID)
		}
	}
	d, err := c.Destroy(ctx, sb.ID)
	if err != nil || d.State != client.StateDestroyed || d.SnapshotID != apitest.SnapDestroyed {
		t.Errorf("destroy: got %+v, %v, want DESTROYED with snapshot %s", d, err, apitest.SnapDestroyed)
	}
}

func TestExec(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)
	e.fake.ExecStdout = []byte("out\x00\xff")

	res, err := c.Exec(ctx, apitest.SandboxRunning, client.ExecRequest{Command: []string{"cat"}, TimeoutSec: client.Ptr[int64](5),
		Stdin: []byte{0xff, 0}, Cwd: "/workspace/sub", Env: map[string]string{"X": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExecID != apitest.ExecEnded || res.ExitCode != 3 || res.Stdout != "out\x00\xff" || res.Stderr != "warn\n" ||
		!res.StdoutTruncated || res.Duration != 1500*time.Millisecond || res.State != client.ExecEnded {
		t.Errorf("got exec %+v, want exit 3 with the exact stdout bytes", res)
	}
	req := e.fake.Last("Exec").Exec
	if !bytes.Equal(req.Stdin, []byte{0xff, 0}) || *req.TimeoutSec != 5 || req.Cwd != "/workspace/sub" || req.Env["X"] != "y" || req.Detach {
		t.Errorf("the server got exec %+v, want the request's fields, waited", req)
	}

	st, err := c.ExecDetached(ctx, apitest.SandboxRunning, client.ExecRequest{Command: []string{"sleep", "60"}})
	if err != nil || st.ExecID != apitest.ExecRunning || st.State != client.ExecRunning || st.StatusURL == "" {
		t.Errorf("detached: got %+v, %v, want %s RUNNING with a status URL", st, err, apitest.ExecRunning)
	}
	if !e.fake.Last("Exec").Exec.Detach {
		t.Error("the server got a waited exec, want a detached one")
	}
	st, err = c.ExecStatus(ctx, apitest.SandboxRunning, apitest.ExecEnded)
	if err != nil || st.Stdout != "hello\n" || st.Stderr != "oops\xff" || st.ExitCode != 3 {
		t.Errorf("status: got %+v, %v, want stdout hello, stderr oops\\xff, exit 3", st, err)
	}
}

func TestErrors(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	tests := []struct {
		name   string
		opts   []client.Option
		id     string
		code   string
		status int
		retry  bool
	}{
		{"not-found", nil, "sbx_nope", client.CodeNotFound, http.StatusNotFound, false},
		{"busy", nil, apitest.SandboxBusy, client.CodeInvalidState, http.StatusConflict, true},
		{"bad-key", []client.Option{client.WithAPIKey("wrong")}, apitest.SandboxRunning, client.CodeUnauthenticated, http.StatusUnauthorized, false},
		{"scope-from-user-key", []client.Option{client.WithScope("t", "p")}, apitest.SandboxRunning, client.CodePermissionDenied, http.StatusForbidden, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client(t, tt.opts...).Stop(ctx, tt.id)
			var ae *client.Error
			if !errors.As(err, &ae) {
				t.Fatalf("got %v, want a *client.Error", err)
			}
			if ae.Code != tt.code || ae.Status != tt.status || (ae.RetryAfter > 0) != tt.retry || ae.Message == "" {
				t.Errorf("got %+v, want code %s, status %d, retry-after %v and a message", ae, tt.code, tt.status, tt.retry)
			}
			if !client.IsCode(fmt.Errorf("wrapped: %w", err), tt.code) {
				t.Errorf("IsCode(%v, %s) = false, want true", err, tt.code)
			}
		})
	}
	// A platform key may act for another project.
	sb, err := e.client(t, client.WithAPIKey(apitest.PlatformKey), client.WithScope("t", "p")).Get(ctx, apitest.SandboxRunning)
	if err != nil || sb.TenantID != "t" || sb.ProjectID != "p" {
		t.Errorf("scoped get: got %+v, %v, want tenant t project p", sb, err)
	}
}

func TestFilesAndSnapshots(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)
	fi, err := c.WriteFile(ctx, apitest.SandboxRunning, "dir/a.txt", strings.NewReader("data"), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if w := e.fake.Last("WriteFile"); string(w.Data) != "data" || w.Path != "dir/a.txt" || w.Mode != 0o600 {
		t.Errorf("the server got write %q to %q mode %o, want data to dir/a.txt 600", w.Data, w.Path, w.Mode)
	}
	if fi.Size != 4 {
		t.Errorf("got file info %+v, want size 4", fi)
	}
	e.fake.File = []byte("content")
	if b, err := c.ReadFile(ctx, apitest.SandboxRunning, "a.txt"); err != nil || string(b) != "content" {
		t.Errorf("read: got %q, %v, want content", b, err)
	}
	if l, err := c.ListFiles(ctx, apitest.SandboxRunning, "", 5); err != nil || l.Path != "." {
		t.Errorf("list: got %+v, %v, want the listing of .", l, err)
	}
	snap, err := c.Snapshot(ctx, apitest.SandboxRunning)
	if err != nil || snap.ID != apitest.SnapLatest {
		t.Errorf("snapshot: got %+v, %v, want %s", snap, err, apitest.SnapLatest)
	}
	snaps, err := c.Snapshots(ctx, apitest.SandboxRunning, 10)
	if err != nil || len(snaps) != 2 {
		t.Errorf("snapshots: got %+v, %v, want 2", snaps, err)
	}
	if _, err := c.Snapshots(ctx, "", 0); err != nil {
		t.Errorf("project snapshots: %v", err)
	}
	if err := c.DeleteSnapshot(ctx, apitest.SnapOld); err != nil {
		t.Errorf("delete %s: %v", apitest.SnapOld, err)
	}
	if err := c.DeleteSnapshot(ctx, apitest.SnapLatest); !client.IsCode(err, client.CodeInvalidState) {
		t.Errorf("delete %s: got %v, want INVALID_STATE", apitest.SnapLatest, err)
	}
}

func TestAgentRuns(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)
	run, err := c.StartAgentRun(ctx, client.AgentRunRequest{AgentID: "opencode", Model: "m", Instruction: "fix it", SandboxID: apitest.SandboxRunning})
	if err != nil || run.ID != apitest.RunRunning {
		t.Fatalf("start: got %+v, %v, want %s", run, err, apitest.RunRunning)
	}
	if got, err := c.AgentRun(ctx, apitest.RunDone); err != nil || !got.Final() {
		t.Errorf("get: got %+v, %v, want a final run", got, err)
	}
	if runs, err := c.AgentRuns(ctx, apitest.SandboxRunning); err != nil || len(runs) == 0 {
		t.Errorf("list: got %+v, %v, want runs", runs, err)
	}
	if got, err := c.CancelAgentRun(ctx, apitest.RunRunning); err != nil || got.Status != client.RunCancelled {
		t.Errorf("cancel: got %+v, %v, want CANCELLED", got, err)
	}
	s, err := c.AgentRunEvents(ctx, apitest.RunDone, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var kinds []string
	for {
		ev, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, ev.Kind)
	}
	if len(kinds) == 0 || kinds[0] != client.KindStatus {
		t.Errorf("got events %v, want a status first", kinds)
	}
}

// outputEvents are an exec's output: chunks (one binary), a gap, the exit.
func outputEvents(n int) []sandbox.ExecEvent {
	var evs []sandbox.ExecEvent
	for i := range n {
		evs = append(evs, sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: fmt.Sprintf("%d-0", i+1), Stream: "stdout", Data: []byte(fmt.Sprintf("line %d\n", i))})
	}
	evs[1].Data = []byte{0, 0xff}
	evs[2] = sandbox.ExecEvent{Kind: sandbox.ExecTruncated, Cursor: evs[2].Cursor, MissedBytes: 42}
	end := apitest.EndedExec()
	return append(evs, sandbox.ExecEvent{Kind: sandbox.ExecExit, Cursor: fmt.Sprintf("%d-0", n+1), Result: &end})
}

// want is what a client should see of evs: cursor, kind and data of each.
func want(evs []sandbox.ExecEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("%s %s %q %d", ev.Cursor, strings.ToLower(string(ev.Kind)), ev.Data, ev.MissedBytes))
	}
	return out
}

func TestExecOutputResumesAfterCut(t *testing.T) {
	for _, cut := range []int{0, 1, 4} {
		t.Run(fmt.Sprintf("cut-after-%d", cut), func(t *testing.T) {
			e := newEnv(t)
			c := e.client(t)
			evs := outputEvents(6)
			e.fake.ExecEvents[apitest.ExecEnded] = evs
			e.cut.Arm(cut)
			s, err := c.ExecOutput(ctxT(t), apitest.SandboxRunning, apitest.ExecEnded, "")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var got []string
			for {
				ev, err := s.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got = append(got, fmt.Sprintf("%s %s %q %d", ev.Cursor, ev.Kind, ev.Data, ev.MissedBytes))
				if ev.Kind == client.KindExit && (ev.Exec == nil || ev.Exec.ExitCode != 3) {
					t.Errorf("got exit %+v, want exit code 3", ev.Exec)
				}
			}
			if w := want(evs); !reflect.DeepEqual(got, w) {
				t.Errorf("got events\n%v\nwant\n%v", got, w)
			}
			wantCuts := 0
			if cut > 0 {
				wantCuts = 1
			}
			if n := e.cut.Count(); n != wantCuts {
				t.Errorf("got %d cuts, want %d", n, wantCuts)
			}
			if cut > 0 {
				if afters := e.fake.CallsTo("ExecOutput"); len(afters) != 2 || afters[1].After != evs[cut-1].Cursor {
					t.Errorf("got output subscriptions %+v, want a second after %s", afters, evs[cut-1].Cursor)
				}
			}
		})
	}
}

func TestExecStream(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	evs := outputEvents(4)
	e.fake.ExecEvents[apitest.ExecRunning] = evs
	e.cut.Arm(2)
	s, err := c.ExecStream(ctxT(t), apitest.SandboxRunning, client.ExecRequest{Command: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	first := true
	for {
		ev, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first {
			if ev.Kind != client.KindStarted || ev.Exec.ExecID != apitest.ExecRunning {
				t.Fatalf("got first event %+v, want started of %s", ev, apitest.ExecRunning)
			}
			first = false
			continue
		}
		got = append(got, fmt.Sprintf("%s %s %q %d", ev.Cursor, ev.Kind, ev.Data, ev.MissedBytes))
	}
	if w := want(evs); !reflect.DeepEqual(got, w) {
		t.Errorf("got events\n%v\nwant\n%v", got, w)
	}
	if s.ExecID() != apitest.ExecRunning || e.cut.Count() != 1 {
		t.Errorf("got exec %q and %d cuts, want %s and 1", s.ExecID(), e.cut.Count(), apitest.ExecRunning)
	}
}

func TestExecOutputAfterExitIsEmpty(t *testing.T) {
	e := newEnv(t)
	evs := outputEvents(3)
	e.fake.ExecEvents[apitest.ExecEnded] = evs
	s, err := e.client(t).ExecOutput(ctxT(t), apitest.SandboxRunning, apitest.ExecEnded, evs[len(evs)-1].Cursor)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Next(); err != io.EOF {
		t.Errorf("got %+v, %v, want io.EOF (204)", ev, err)
	}
}
