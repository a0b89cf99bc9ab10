package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

func TestUsageErrors(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name    string
		environ map[string]string
		args    []string
		msg     string
	}{
		{"unknown-command", nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown-subcommand", nil, []string{"snapshot", "bogus"}, "takes no arguments"},
		{"unknown-flag", nil, []string{"list", "--nope"}, "unknown flag: --nope"},
		{"missing-argument", nil, []string{"get"}, "wants 1 argument"},
		{"extra-argument", nil, []string{"get", "a", "b"}, "wants 1 argument"},
		{"exec-without-command", nil, []string{"exec", apitest.SandboxRunning, "--"}, "wants a command"},
		{"bad-output", nil, []string{"list", "-o", "yaml"}, "--output must be text or json"},
		{"no-key", map[string]string{client.EnvAPIKey: ""}, []string{"list"}, "no API key"},
		{"bad-url", map[string]string{client.EnvGatewayURL: "ftp://x"}, []string{"list"}, "not an http(s) URL"},
		{"tenant-without-project", nil, []string{"--tenant", "t", "list"}, "--tenant and --project go together"},
		{"cp-both-local", nil, []string{"cp", "a", "./b:c"}, "one side as SANDBOX:PATH"},
		{"cp-both-remote", nil, []string{"cp", "sbx_a:x", "sbx_b:y"}, "not both"},
		{"after-without-follow", nil, []string{"logs", apitest.ExecEnded, "--after", "1-0"}, "--after goes with --follow"},
		{"two-sources", nil, []string{"create", "--snapshot", "s", "--archive-url", "https://x"}, "none of the others can be"},
		{"bad-env", nil, []string{"create", "--env", "NOEQUALS"}, "--env wants NAME=VALUE"},
		{"agent-without-agent", nil, []string{"agent", "start", apitest.SandboxRunning, "--instruction", "x"}, `required flag(s) "agent"`},
		{"agent-two-instructions", nil, []string{"agent", "start", apitest.SandboxRunning, "--agent", "a", "--instruction", "x", "--instruction-file", "f"}, "exactly one of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.ws.Calls())
			r := e.run(t, "", tt.environ, tt.args...).want(t, exitUsage)
			if !strings.Contains(r.stderr, tt.msg) || !strings.Contains(r.stderr, "--help' for usage") {
				t.Errorf("got stderr %q, want %q and the help hint", r.stderr, tt.msg)
			}
			if calls := e.ws.Calls()[before:]; len(calls) != 0 {
				t.Errorf("the server got %d calls, want none", len(calls))
			}
		})
	}
	// JSON errors too.
	r := e.run(t, "", nil, "-o", "json", "get").want(t, exitUsage)
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal([]byte(r.stderr), &body); err != nil || body.Error.Code != "USAGE" {
		t.Errorf("got stderr %q (%v), want a JSON error with code USAGE", r.stderr, err)
	}
}

func TestServerErrors(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "get", "sbx_other").want(t, exitServer)
	if want := "sandboxctl: NOT_FOUND: sandbox sbx_other not found\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}
	r = e.run(t, "", nil, "stop", apitest.SandboxBusy).want(t, exitServer)
	if !strings.HasPrefix(r.stderr, "sandboxctl: INVALID_STATE: ") || !strings.Contains(r.stderr, "(retry after ") {
		t.Errorf("got stderr %q, want INVALID_STATE with its retry-after", r.stderr)
	}
	r = e.run(t, "", nil, "-o", "json", "get", apitest.SandboxBoom).want(t, exitServer)
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &body); err != nil || body.Error["code"] != "INTERNAL" || body.Error["status"] != float64(500) {
		t.Errorf("got stderr %q (%v), want a JSON INTERNAL error with status 500", r.stderr, err)
	}
	if strings.Contains(r.stderr, apitest.SecretCause) {
		t.Errorf("stderr %q shows the server's hidden cause", r.stderr)
	}
	r = e.run(t, "", map[string]string{client.EnvAPIKey: "wrong"}, "list").want(t, exitServer)
	if !strings.Contains(r.stderr, "UNAUTHENTICATED") {
		t.Errorf("got stderr %q, want UNAUTHENTICATED", r.stderr)
	}
	// Scope headers: a user key may not send them; a platform key acts for the project.
	r = e.run(t, "", map[string]string{envTenant: "t", envProject: "p"}, "get", apitest.SandboxRunning).want(t, exitServer)
	if !strings.Contains(r.stderr, "PERMISSION_DENIED") {
		t.Errorf("got stderr %q, want PERMISSION_DENIED", r.stderr)
	}
	r = e.run(t, "", nil, "--api-key", apitest.PlatformKey, "--tenant", "t", "--project", "p", "-o", "json", "get", apitest.SandboxRunning).want(t, exitOK)
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.TenantID != "t" || sb.ProjectID != "p" {
		t.Errorf("got %q (%v), want the sandbox of t/p", r.stdout, err)
	}
}

func TestSandboxCommands(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "create", "--profile", "big", "--autostop-sec", "60", "--ttl-sec", "600", "--env", "A=1", "--env", "B=x=y",
		"--snapshot", apitest.SnapOld).want(t, exitOK)
	got := e.ws.Last("Create").Create
	if got.Profile != "big" || *got.AutostopSec != 60 || *got.TTLSec != 600 || got.Env["A"] != "1" || got.Env["B"] != "x=y" ||
		got.Source == nil || got.Source.SnapshotID != apitest.SnapOld {
		t.Errorf("the server got create %+v, want the flags", got)
	}
	for _, want := range []string{"sandbox_id:", apitest.SandboxRunning, "state:", "RUNNING", "2000 milli-CPU, 4.0 GiB memory, 10.0 GiB disk"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("create printed %q, want %q in it", r.stdout, want)
		}
	}
	e.run(t, "", nil, "create").want(t, exitOK)
	if got := e.ws.Last("Create").Create; got.AutostopSec != nil || got.TTLSec != nil || got.Source != nil || got.Env != nil {
		t.Errorf("the server got create %+v, want the server's defaults", got)
	}
	if r := e.run(t, "", nil, "create", "-q").want(t, exitOK); r.stdout != apitest.SandboxRunning+"\n" {
		t.Errorf("create -q printed %q, want the id alone", r.stdout)
	}

	r = e.run(t, "", nil, "list", "--state", "running", "--limit", "2").want(t, exitOK)
	if opts := e.ws.Last("List").List; opts.State != sandbox.Running || opts.Limit != 2 {
		t.Errorf("the server got list %+v, want RUNNING, limit 2", opts)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SANDBOX ID") || !strings.HasPrefix(lines[1], apitest.SandboxRunning) {
		t.Errorf("list printed %q, want a header and two rows", r.stdout)
	}
	if !strings.Contains(r.stderr, "more: sandboxctl list --cursor ") {
		t.Errorf("list said %q on stderr, want how to get the next page", r.stderr)
	}
	before := len(e.ws.CallsTo("List"))
	r = e.run(t, "", nil, "list", "--all", "-o", "json").want(t, exitOK)
	var page client.Page
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Sandboxes) != 4 {
		t.Errorf("list --all -o json: got %q (%v), want 4 sandboxes of two pages", r.stdout, err)
	}
	if n := len(e.ws.CallsTo("List")) - before; n != 2 {
		t.Errorf("list --all made %d calls, want 2 (the fake answers its last page again)", n)
	}
	if r := e.run(t, "", nil, "ls", "-q").want(t, exitOK); len(strings.Fields(r.stdout)) != 2 {
		t.Errorf("ls -q printed %q, want two ids", r.stdout)
	}

	for _, verb := range []string{"get", "stop", "start", "pause", "resume", "destroy"} {
		r := e.run(t, "", nil, "-o", "json", verb, apitest.SandboxRunning).want(t, exitOK)
		var sb client.Sandbox
		if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.ID != apitest.SandboxRunning {
			t.Errorf("%s -o json: got %q (%v), want the sandbox", verb, r.stdout, err)
		}
		switch verb {
		case "stop":
			if sb.State != client.StateStopped {
				t.Errorf("stop: got state %s, want STOPPED", sb.State)
			}
		case "pause":
			if sb.State != client.StatePaused {
				t.Errorf("pause: got state %s, want PAUSED", sb.State)
			}
		case "resume":
			if sb.State != client.StateRunning {
				t.Errorf("resume: got state %s, want RUNNING", sb.State)
			}
		case "destroy":
			if sb.State != client.StateDestroyed || sb.SnapshotID != apitest.SnapDestroyed {
				t.Errorf("destroy: got %+v, want DESTROYED with snapshot %s", sb, apitest.SnapDestroyed)
			}
		}
	}
	if r := e.run(t, "", nil, "destroy", apitest.SandboxRunning).want(t, exitOK); !strings.Contains(r.stdout, "snapshot_id:") {
		t.Errorf("destroy printed %q, want its snapshot id", r.stdout)
	}
	if r := e.run(t, "", nil, "quota").want(t, exitOK); !strings.Contains(r.stdout, "in use:  3") || !strings.Contains(r.stdout, "limit:   10") {
		t.Errorf("quota printed %q, want 3 of 10", r.stdout)
	}
}

// execEvents are an exec's output: stdout, stderr, binary stdout, a gap, more, and its exit.
func execEvents(exit sandbox.ExecResult) []sandbox.ExecEvent {
	exit.ExecID, exit.SandboxID, exit.State = apitest.ExecRunning, apitest.SandboxRunning, sandbox.ExecEnded
	return []sandbox.ExecEvent{
		{Kind: sandbox.ExecChunk, Cursor: "1-0", Stream: "stdout", Data: []byte("out 1\n")},
		{Kind: sandbox.ExecChunk, Cursor: "2-0", Stream: "stderr", Data: []byte("err 1\n")},
		{Kind: sandbox.ExecChunk, Cursor: "3-0", Stream: "stdout", Data: []byte{0, 0xff, '\n'}},
		{Kind: sandbox.ExecTruncated, Cursor: "4-0", MissedBytes: 42},
		{Kind: sandbox.ExecChunk, Cursor: "5-0", Stream: "stdout", Data: []byte("out 2\n")},
		{Kind: sandbox.ExecExit, Cursor: "6-0", Result: &exit},
	}
}

func TestExec(t *testing.T) {
	tests := []struct {
		name   string
		exit   sandbox.ExecResult
		code   int
		stderr string // besides the output
	}{
		{"exit-code", sandbox.ExecResult{ExitCode: 7}, 7, ""},
		{"success", sandbox.ExecResult{}, 0, ""},
		{"killed", sandbox.ExecResult{ExitCode: -1, Signal: "SIGTERM"}, 128 + 15, "was killed by SIGTERM"},
		{"timed-out", sandbox.ExecResult{ExitCode: 137, Signal: "SIGKILL", TimedOut: true}, 137, "timed out and was killed (SIGKILL)"},
		{"not-found", sandbox.ExecResult{ExitCode: 127, Error: "nope: command not found"}, 127, ""},
		{"not-followed", sandbox.ExecResult{ExitCode: -1, Error: "the sandbox stopped"}, exitServer, "the sandbox stopped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.ws.ExecEvents[apitest.ExecRunning] = execEvents(tt.exit)
			r := e.run(t, "", nil, "exec", "--timeout-sec", "5", "--env", "X=y", "--cwd", "sub", apitest.SandboxRunning,
				"--", "bash", "-c", "make test").want(t, tt.code)
			if want := "out 1\n\x00\xff\nout 2\n"; r.stdout != want {
				t.Errorf("got stdout %q, want %q", r.stdout, want)
			}
			if !strings.HasPrefix(r.stderr, "err 1\n\nsandboxctl: 42 bytes of output are no longer kept") || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("got stderr %q, want err 1, the gap and %q", r.stderr, tt.stderr)
			}
			req := e.ws.Last("Exec").Exec
			if !req.Detach || !slices.Equal(req.Command, []string{"bash", "-c", "make test"}) || *req.TimeoutSec != 5 || req.Env["X"] != "y" ||
				req.Cwd != "sub" || req.StdinOpen || len(req.Stdin) != 0 {
				t.Errorf("the server got exec %+v, want the flags, detached", req)
			}
			if o := e.ws.Last("ExecOutput"); o.ID != apitest.ExecRunning || o.After != "" {
				t.Errorf("followed %s after %q, want %s from the start", o.ID, o.After, apitest.ExecRunning)
			}
		})
	}
}

func TestExecJSON(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{ExitCode: 3})
	r := e.run(t, "", nil, "-o", "json", "exec", apitest.SandboxRunning, "make").want(t, 3)
	var kinds []string
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil || !strings.HasPrefix(line, `{"event":`) {
			t.Fatalf("line %q (%v), want a JSON object that starts with its event", line, err)
		}
		kinds = append(kinds, fmt.Sprint(ev["event"]))
		switch {
		case ev["cursor"] == "3-0" && ev["data_base64"] != "AP8K":
			t.Errorf("binary chunk: got %v, want data_base64 AP8K", ev)
		case ev["event"] == "exit" && ev["exec"].(map[string]any)["exit_code"] != float64(3):
			t.Errorf("exit: got %v, want exit_code 3", ev)
		}
	}
	if want := []string{"started", "chunk", "chunk", "chunk", "truncated", "chunk", "exit"}; !slices.Equal(kinds, want) {
		t.Errorf("got events %v, want %v", kinds, want)
	}
	if r.stderr != "" {
		t.Errorf("got stderr %q, want nothing (JSON carries it)", r.stderr)
	}
}

// A dropped output stream is resumed after the last cursor: nothing lost, nothing twice.
func TestExecResumesAfterADrop(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{ExitCode: 4})
	e.cut.Arm(2)
	r := e.run(t, "", nil, "exec", apitest.SandboxRunning, "make").want(t, 4)
	if want := "out 1\n\x00\xff\nout 2\n"; r.stdout != want {
		t.Errorf("got stdout %q, want %q", r.stdout, want)
	}
	if e.cut.Count() != 1 {
		t.Fatalf("the stream was cut %d times, want 1", e.cut.Count())
	}
	calls := e.ws.CallsTo("ExecOutput")
	if len(calls) != 2 || calls[1].After != "2-0" {
		t.Errorf("got output calls %+v, want a second one after 2-0", calls)
	}
}

// Ctrl-C detaches: the command runs on, sandboxctl says how to follow it from its cursor.
func TestExecDetachesOnInterrupt(t *testing.T) {
	e := newEnv(t)
	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{})[:2]
	e.ws.ExecHold = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	go func() {
		for !strings.Contains(stderr.String(), "err 1") {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	r := e.runCtx(t, ctx, "", nil, nil, &stderr, "exec", apitest.SandboxRunning, "sleep", "60").want(t, exitInterrupted)
	want := "sandboxctl: detached; " + apitest.ExecRunning + " runs on in the sandbox.\nfollow it on: sandboxctl logs " + apitest.ExecRunning + " --follow --after 2-0\n"
	if !strings.HasSuffix(r.stderr, want) {
		t.Errorf("got stderr %q, want it to end with %q", r.stderr, want)
	}
	if r.stdout != "out 1\n" {
		t.Errorf("got stdout %q, want out 1", r.stdout)
	}
	if calls := e.ws.Called(); slices.Contains(calls, "CancelExec") {
		t.Errorf("the server got %v, want nothing that stops the command", calls)
	}
}

func TestExecDetach(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "exec", "-d", apitest.SandboxRunning, "sleep", "60").want(t, exitOK)
	if r.stdout != apitest.ExecRunning+"\n" || !strings.Contains(r.stderr, "sandboxctl logs "+apitest.ExecRunning+" --follow") {
		t.Errorf("got %q / %q, want the exec id and how to follow it", r.stdout, r.stderr)
	}
	if len(e.ws.CallsTo("ExecOutput")) != 0 {
		t.Error("exec -d followed the output, want it not to")
	}
}

func TestLogs(t *testing.T) {
	e := newEnv(t)
	r := e.run(t, "", nil, "logs", apitest.ExecEnded).want(t, exitOK)
	if r.stdout != "hello\n" || !strings.HasPrefix(r.stderr, "oops\xff") || !strings.Contains(r.stderr, "no longer kept") {
		t.Errorf("got %q / %q, want the kept stdout, stderr and that it is truncated", r.stdout, r.stderr)
	}
	r = e.run(t, "", nil, "logs", "-o", "json", apitest.ExecEnded).want(t, exitOK)
	var st execJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.SandboxID != apitest.SandboxRunning || *st.ExitCode != 3 ||
		*st.Stdout != "hello\n" || st.StderrBase64 != "b29wc/8=" {
		t.Errorf("got %q (%v), want the exec with its output", r.stdout, err)
	}

	e.ws.ExecEvents[apitest.ExecRunning] = execEvents(sandbox.ExecResult{ExitCode: 9})
	r = e.run(t, "", nil, "logs", apitest.ExecRunning, "--follow", "--after", "3-0").want(t, 9)
	if r.stdout != "out 2\n" {
		t.Errorf("logs --follow --after 3-0: got %q, want out 2 only", r.stdout)
	}
	if o := e.ws.Last("ExecOutput"); o.After != "3-0" {
		t.Errorf("followed after %q, want 3-0", o.After)
	}
	if r := e.run(t, "", nil, "logs", "exec_other").want(t, exitServer); !strings.Contains(r.stderr, "NOT_FOUND") {
		t.Errorf("another tenant's exec: got %q, want NOT_FOUND", r.stderr)
	}
}

func TestCp(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	must(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "sub", "a.txt"), []byte("alpha"), 0o640))
	must(t, os.Symlink("/etc/shadow", filepath.Join(src, "shadow")))

	r := e.run(t, "", nil, "cp", src, apitest.SandboxRunning+":/workspace/in/").want(t, exitOK)
	if n, ok := e.ws.Entry("in/src/sub/a.txt"); !ok || string(n.Data) != "alpha" || n.Mode != 0o640 {
		t.Errorf("got in/src/sub/a.txt %+v (%v), want alpha 0640", n, ok)
	}
	if want := "copied 1 file(s), 5 B, and 2 folder(s) to " + apitest.SandboxRunning + ":/workspace/in/src\n"; r.stdout != want {
		t.Errorf("got stdout %q, want %q", r.stdout, want)
	}
	if want := "skipped " + filepath.Join(src, "shadow") + ": a symbolic link (to /etc/shadow); cp never follows links\n"; r.stderr != want {
		t.Errorf("got stderr %q, want %q", r.stderr, want)
	}

	out := filepath.Join(dir, "out")
	r = e.run(t, "", nil, "cp", "-o", "json", apitest.SandboxRunning+":in", out).want(t, exitOK)
	var res client.CopyResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Files != 1 || res.Dest != out {
		t.Errorf("got %q (%v), want one file copied to %s", r.stdout, err, out)
	}
	if b, err := os.ReadFile(filepath.Join(out, "src", "sub", "a.txt")); err != nil || string(b) != "alpha" {
		t.Errorf("got %q, %v, want alpha", b, err)
	}

	// Standard input and output.
	e.run(t, "piped\n", nil, "cp", "-", apitest.SandboxRunning+":p.txt").want(t, exitOK)
	if r := e.run(t, "", nil, "cp", apitest.SandboxRunning+":p.txt", "-").want(t, exitOK); r.stdout != "piped\n" {
		t.Errorf("cp SBX:p.txt - printed %q, want piped", r.stdout)
	}

	// Hostile: a link to the host's /etc/shadow inside the sandbox, .. in the remote path, a
	// local link as the source, another tenant's sandbox.
	e.ws.Put("shadow", apitest.Node{Link: "/etc/shadow"})
	for _, tt := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"cp", apitest.SandboxRunning + ":shadow", filepath.Join(dir, "stolen")}, exitServer, "INVALID_ARGUMENT: path escapes the workspace"},
		{[]string{"cp", apitest.SandboxRunning + ":../etc/passwd", filepath.Join(dir, "stolen")}, exitServer, "INVALID_ARGUMENT: path ../etc/passwd is outside the workspace"},
		{[]string{"cp", filepath.Join(src, "sub", "a.txt"), apitest.SandboxRunning + ":../../x"}, exitServer, "INVALID_ARGUMENT"},
		{[]string{"cp", filepath.Join(src, "shadow"), apitest.SandboxRunning + ":x"}, exitLocal, "is a symbolic link; cp never follows links"},
		{[]string{"cp", "sbx_other:x", filepath.Join(dir, "stolen")}, exitServer, "NOT_FOUND"},
		{[]string{"cp", "--max-files", "1", apitest.SandboxRunning + ":in", filepath.Join(dir, "partial")}, exitLocal, "more than 1 files and folders"},
	} {
		r := e.run(t, "", nil, tt.args...).want(t, tt.code)
		if !strings.Contains(r.stderr, tt.msg) {
			t.Errorf("%v: got stderr %q, want %q", tt.args, r.stderr, tt.msg)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "stolen")); err == nil {
		t.Error("a refused copy left a local file, want none")
	}

	// Names the sandbox chose never reach the terminal as escape sequences.
	e.ws.Put("esc/\x1b]0;pwned\x07", apitest.Node{Link: "\x1b[2J"})
	r = e.run(t, "", nil, "cp", apitest.SandboxRunning+":esc", filepath.Join(dir, "esc")).want(t, exitOK)
	if strings.ContainsRune(r.stderr, 0x1b) || !strings.Contains(r.stderr, `skipped "esc/\x1b]0;pwned\a": "a symbolic link (to \x1b[2J)`) {
		t.Errorf("got stderr %q, want the names quoted", r.stderr)
	}
}

func TestSnapshotAndAgentCommands(t *testing.T) {
	e := newEnv(t)
	if r := e.run(t, "", nil, "snapshot", "create", apitest.SandboxRunning).want(t, exitOK); !strings.Contains(r.stdout, apitest.SnapLatest) {
		t.Errorf("snapshot create printed %q, want %s", r.stdout, apitest.SnapLatest)
	}
	r := e.run(t, "", nil, "snapshots", "ls", apitest.SandboxRunning, "--limit", "5").want(t, exitOK)
	if !strings.Contains(r.stdout, apitest.SnapOld) || e.ws.Last("ListSnapshots").Limit != 5 {
		t.Errorf("snapshot list printed %q, want both snapshots, limit 5", r.stdout)
	}
	r = e.run(t, "", nil, "-o", "json", "snapshot", "list").want(t, exitOK)
	var snaps struct{ Snapshots []client.Snapshot }
	if err := json.Unmarshal([]byte(r.stdout), &snaps); err != nil || len(snaps.Snapshots) != 2 {
		t.Errorf("got %q (%v), want two snapshots", r.stdout, err)
	}
	e.run(t, "", nil, "snapshot", "delete", apitest.SnapOld).want(t, exitOK)
	if r := e.run(t, "", nil, "snapshot", "rm", apitest.SnapLatest).want(t, exitServer); !strings.Contains(r.stderr, "INVALID_STATE") {
		t.Errorf("deleting the latest snapshot: got %q, want INVALID_STATE", r.stderr)
	}

	instr := filepath.Join(t.TempDir(), "instr.md")
	must(t, os.WriteFile(instr, []byte("fix it"), 0o644))
	r = e.run(t, "", nil, "agent", "start", apitest.SandboxRunning, "--agent", "opencode", "--model", "m", "--instruction-file", instr,
		"--config", `{"k":1}`).want(t, exitOK)
	if req := e.ws.Last("StartAgentRun").AgentRun; req.Instruction != "fix it" || req.AgentID != "opencode" || string(req.Config) != `{"k":1}` {
		t.Errorf("the server got run %+v, want the flags", req)
	}
	if !strings.Contains(r.stdout, apitest.RunRunning) {
		t.Errorf("agent start printed %q, want the run", r.stdout)
	}
	if r := e.run(t, "", nil, "agent", "list", apitest.SandboxRunning).want(t, exitOK); !strings.Contains(r.stdout, apitest.RunDone) {
		t.Errorf("agent list printed %q, want both runs", r.stdout)
	}
	if r := e.run(t, "", nil, "agent", "cancel", apitest.RunRunning).want(t, exitOK); !strings.Contains(r.stdout, "CANCELLED") {
		t.Errorf("agent cancel printed %q, want CANCELLED", r.stdout)
	}
	if r := e.run(t, "", nil, "agent", "logs", apitest.RunDone).want(t, exitOK); !strings.Contains(r.stderr, "is SUCCEEDED") {
		t.Errorf("agent logs said %q, want the final status", r.stderr)
	}
	r = e.run(t, "", nil, "agent", "logs", "-o", "json", apitest.RunDone).want(t, exitOK)
	var events []streamEvent
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var ev streamEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		events = append(events, ev)
	}
	if len(events) < 2 || events[0].Run == nil || last(events).Run == nil || last(events).Run.Status != client.RunSucceeded {
		t.Errorf("agent logs -o json: got %+v, want its status first and SUCCEEDED last", events)
	}
}

func TestCompletion(t *testing.T) {
	e := newEnv(t)
	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := e.run(t, "", map[string]string{client.EnvAPIKey: ""}, "completion", shell).want(t, exitOK)
		if !strings.Contains(r.stdout, "sandboxctl") || len(r.stdout) < 1000 {
			t.Errorf("completion %s printed %d bytes, want a script", shell, len(r.stdout))
		}
	}
	r := e.run(t, "", nil, "__complete", "get", "").want(t, exitOK)
	if !strings.Contains(r.stdout, apitest.SandboxRunning+"\tRUNNING sandboxes-default") {
		t.Errorf("completing get printed %q, want the sandboxes with their state", r.stdout)
	}
	r = e.run(t, "", nil, "__complete", "cp", "sbx").want(t, exitOK)
	if !strings.Contains(r.stdout, apitest.SandboxRunning+":\t") {
		t.Errorf("completing cp printed %q, want SANDBOX: prefixes", r.stdout)
	}
	r = e.run(t, "", nil, "__complete", "list", "--output", "").want(t, exitOK)
	if !strings.Contains(r.stdout, "json") {
		t.Errorf("completing --output printed %q, want json", r.stdout)
	}
}

func last[T any](s []T) T { return s[len(s)-1] }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
