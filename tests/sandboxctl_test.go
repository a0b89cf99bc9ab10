package tests

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

// ctl runs sandboxctl without a terminal and answers its stdout, stderr and exit code.
func ctl(t *testing.T, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(e2e.Sandboxctl(t), args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// ctlOK runs sandboxctl and fails t unless it exits 0.
func ctlOK(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := ctl(t, env, "", args...)
	if code != 0 {
		t.Fatalf("sandboxctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// ctlFails runs sandboxctl and fails t unless it exits with code and says want on stderr.
func ctlFails(t *testing.T, env []string, code int, want string, args ...string) string {
	t.Helper()
	out, errOut, got := ctl(t, env, "", args...)
	if got != code || !strings.Contains(errOut, want) {
		t.Fatalf("sandboxctl %s: got exit %d and stderr %q (stdout %q), want exit %d and %q", strings.Join(args, " "), got, errOut, out, code, want)
	}
	return errOut
}

// ctlCreate creates a sandbox of env's tenant through sandboxctl and tracks it.
func ctlCreate(t *testing.T, s *e2e.Server, env []string, hdr string) string {
	t.Helper()
	id := strings.TrimSpace(ctlOK(t, env, "create", "-q"))
	if !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create -q printed %q, want an id", id)
	}
	s.Track(id, hdr)
	return id
}

// TestSandboxctl drives the built sandboxctl, on a pseudo-terminal where a user would see it,
// against the built server on real runsc: create, get and list as JSON, exec with live output
// and its exit code, Ctrl-C that detaches and logs --follow that follows on from the cursor,
// cp in and out with content checks, the attacks a sandbox or another tenant would try through
// it, a huge output, stop/start/destroy.
func TestSandboxctl(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	bin := e2e.Sandboxctl(t)
	env, other := s.CtlEnv(e2e.KeyTenant1), s.CtlEnv(e2e.KeyTenant2)

	var id string
	e2e.Step(t, "create", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "create", "--autostop-sec", "1800", "--env", "GREETING=hello", "-q")
		out, code := p.Wait(t, 3*time.Minute)
		id = strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(id, "sbx_") || strings.ContainsAny(id, " \n") {
			t.Fatalf("create -q: exit %d, printed %q, want exit 0 and the id alone", code, out)
		}
		s.Track(id, e2e.HdrTenant1)
	})

	e2e.Step(t, "get-and-list-as-json", func(t *testing.T) {
		var sb client.Sandbox
		if err := json.Unmarshal([]byte(ctlOK(t, env, "get", id, "-o", "json")), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.ID != id || sb.State != client.StateRunning || sb.AutostopSec != 1800 || sb.AutostopAt == nil {
			t.Errorf("get -o json: got %+v, want %s RUNNING with autostop 1800", sb, id)
		}
		var page client.Page
		if err := json.Unmarshal([]byte(ctlOK(t, env, "list", "-o", "json")), &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Sandboxes) != 1 || page.Sandboxes[0].ID != id {
			t.Errorf("list -o json: got %+v, want the one sandbox %s", page, id)
		}
		if err := json.Unmarshal([]byte(ctlOK(t, other, "list", "-o", "json")), &page); err != nil || len(page.Sandboxes) != 0 {
			t.Errorf("another tenant's list: got %+v, %v, want none", page, err)
		}
		ctlFails(t, other, 69, "NOT_FOUND", "get", id)
	})

	e2e.Step(t, "exec-live-output-and-exit-code", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "exec", id, "--", "bash", "-c", `echo "$GREETING tick 1"; echo warn >&2; sleep 2; echo tick 2; exit 3`)
		p.WaitFor(t, "hello tick 1", time.Minute)
		if strings.Contains(p.Output(), "tick 2") {
			t.Fatalf("tick 1 came with tick 2, want it live (2 s before): %q", p.Output())
		}
		out, code := p.Wait(t, time.Minute)
		if code != 3 || !strings.Contains(out, "warn\n") || !strings.HasSuffix(out, "tick 2\n") {
			t.Errorf("got exit %d and %q, want 3 and both streams", code, out)
		}
		for _, tt := range []struct {
			args []string
			code int
			msg  string
		}{
			{[]string{"exec", id, "--", "false"}, 1, ""},
			{[]string{"exec", id, "--", "bash", "-c", "kill -KILL $$"}, 137, "was killed by SIGKILL"},
			{[]string{"exec", id, "--", "bash", "-c", "kill -TERM $$"}, 143, "was killed by SIGTERM"},
			{[]string{"exec", id, "--", "no-such-program"}, 127, "not found"},
			{[]string{"exec", "--timeout-sec", "1", id, "--", "sleep", "30"}, 137, "timed out"},
			{[]string{"exec", "-i", id, "--", "bash", "-c", "read x; exit $x"}, 42, ""},
		} {
			_, errOut, code := ctl(t, env, "42\n", tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.msg) {
				t.Errorf("%v: got exit %d and stderr %q, want %d and %q", tt.args, code, errOut, tt.code, tt.msg)
			}
		}
		ctlFails(t, other, 69, "NOT_FOUND", "exec", id, "--", "true")
	})

	e2e.Step(t, "ctrl-c-detaches-and-logs-follows-on-from-the-cursor", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "exec", id, "--", "bash", "-c", `for i in $(seq 1 12); do echo n$i; sleep 0.25; done; exit 6`)
		p.WaitFor(t, "n3\n", time.Minute)
		p.Type(t, "\x03")
		first, code := p.Wait(t, time.Minute)
		m := regexp.MustCompile(`follow it on: sandboxctl (logs (exec_\w+) --follow --after (\S+))\n`).FindStringSubmatch(first)
		if code != 130 || !strings.Contains(first, "detached; ") || m == nil {
			t.Fatalf("Ctrl-C: got exit %d and %q, want 130 and how to follow on", code, first)
		}
		execID := m[2]
		p = e2e.StartPTY(t, env, bin, strings.Fields(m[1])...)
		second, code := p.Wait(t, time.Minute)
		if code != 6 {
			t.Errorf("logs --follow: got exit %d (%q), want the command's 6", code, second)
		}
		var lines []string
		for _, l := range strings.Split(first+second, "\n") {
			if strings.HasPrefix(l, "n") {
				lines = append(lines, l)
			}
		}
		want := strings.Fields("n1 n2 n3 n4 n5 n6 n7 n8 n9 n10 n11 n12")
		if strings.Join(lines, " ") != strings.Join(want, " ") {
			t.Errorf("before and after the detach: got %v, want %v once each", lines, want)
		}
		if out := ctlOK(t, env, "logs", execID); out != strings.Join(want, "\n")+"\n" {
			t.Errorf("logs: got %q, want the whole output", out)
		}
		var st struct {
			ExitCode int    `json:"exit_code"`
			State    string `json:"state"`
		}
		if err := json.Unmarshal([]byte(ctlOK(t, env, "logs", execID, "-o", "json")), &st); err != nil || st.ExitCode != 6 || st.State != "ENDED" {
			t.Errorf("logs -o json: got %+v, %v, want ENDED with exit 6", st, err)
		}
		ctlFails(t, other, 69, "NOT_FOUND", "logs", execID)
		ctlFails(t, other, 69, "NOT_FOUND", "logs", execID, "--follow")
	})

	local := t.TempDir()
	e2e.Step(t, "cp-in-and-out", func(t *testing.T) {
		src := filepath.Join(local, "proj")
		blob := make([]byte, 300<<10)
		rand.Read(blob)
		files := map[string][]byte{"a.txt": []byte("alpha\n"), "data/blob.bin": blob, "data/deep/er/c.txt": []byte("gamma")}
		for name, data := range files {
			writeFile(t, filepath.Join(src, name), data, 0o644)
		}
		writeFile(t, filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
		files["run.sh"] = []byte("#!/bin/sh\necho ran\n")
		mustT(t, os.Symlink("/etc/shadow", filepath.Join(src, "shadow"))) // the host's: never followed
		mustT(t, os.Symlink("a.txt", filepath.Join(src, "alias")))

		p := e2e.StartPTY(t, env, bin, "cp", src, id+":/workspace/")
		out, code := p.Wait(t, time.Minute)
		if code != 0 || !strings.Contains(out, "skipped "+filepath.Join(src, "shadow")+": a symbolic link (to /etc/shadow)") ||
			!strings.Contains(out, "copied 4 file(s)") {
			t.Fatalf("cp in: got exit %d and %q, want 4 files copied and the link skipped", code, out)
		}
		sums := ctlOK(t, env, "exec", id, "--", "bash", "-c", "cd /workspace/proj && find . -type f | sort | xargs sha256sum && stat -c %a run.sh && ./run.sh && ls -A")
		for name, data := range files {
			if !strings.Contains(sums, sha256hex(data)+"  ./"+name+"\n") {
				t.Errorf("the sandbox's %s does not hash like the local one: %s", name, sums)
			}
		}
		if !strings.Contains(sums, "\n755\nran\n") || strings.Contains(sums, "shadow") || strings.Contains(sums, "alias") {
			t.Errorf("in the sandbox: %q, want run.sh 755 and runnable, no links", sums)
		}

		p = e2e.StartPTY(t, env, bin, "cp", id+":proj", filepath.Join(local, "back"))
		if out, code := p.Wait(t, time.Minute); code != 0 {
			t.Fatalf("cp out: exit %d: %s", code, out)
		}
		for name, data := range files {
			got, err := os.ReadFile(filepath.Join(local, "back", name))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("back/%s: got %d bytes (%v), want the %d bytes copied in", name, len(got), err, len(data))
			}
		}
		if fi, err := os.Stat(filepath.Join(local, "back", "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("back/run.sh: got %v, %v, want mode 755", fi, err)
		}
		if entries, _ := os.ReadDir(filepath.Join(local, "back")); len(entries) != 3 {
			t.Errorf("back/ holds %d entries, want a.txt, data, run.sh", len(entries))
		}
		if got := ctlOK(t, env, "cp", id+":proj/a.txt", "-"); got != "alpha\n" {
			t.Errorf("cp SBX:proj/a.txt -: got %q, want alpha", got)
		}
	})

	e2e.Step(t, "hostile-cp", func(t *testing.T) {
		ctlOK(t, env, "exec", id, "--", "bash", "-c", `set -e; ln -s /etc/shadow /workspace/shadow; mkdir -p /workspace/d; echo ok > /workspace/d/ok
ln -s /etc/shadow /workspace/d/shadow; ln -s ../../../../etc/shadow /workspace/d/up; ln -s /workspace/d /workspace/d/loop
ln -s /etc /workspace/etc`)
		shadowSum := ctlOK(t, env, "exec", id, "--", "sha256sum", "/etc/shadow")
		stolen := filepath.Join(local, "stolen")
		msg := ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", id+":shadow", stolen)
		t.Logf("cp of a link to /etc/shadow: the server answers %q", strings.TrimSpace(msg))
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", id+":d/up", stolen)
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", id+":/etc/shadow", stolen)
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", id+":../../etc/passwd", stolen)
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", id+":proj/../../etc/passwd", stolen)
		if _, err := os.Lstat(stolen); err == nil {
			t.Fatal("a refused cp left a local file")
		}
		out, errOut, code := ctl(t, env, "", "cp", id+":d", filepath.Join(local, "d"))
		if code != 0 || !strings.Contains(errOut, "skipped d/shadow: a symbolic link (to /etc/shadow)") ||
			!strings.Contains(errOut, "skipped d/up: a symbolic link") || !strings.Contains(errOut, "skipped d/loop: a symbolic link") {
			t.Errorf("cp of a folder with links out: got exit %d, %q / %q, want the links skipped", code, out, errOut)
		}
		entries, _ := os.ReadDir(filepath.Join(local, "d"))
		if len(entries) != 1 || entries[0].Name() != "ok" {
			t.Errorf("the local copy holds %v, want ok alone", entries)
		}
		// Writing into the sandbox through .. or a link out of the workspace.
		a := filepath.Join(local, "proj", "a.txt")
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", a, id+":../escape")
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", a, id+":/etc/motd")
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "cp", a, id+":etc/motd")
		// A write onto a link replaces the link; its target is never written.
		ctlOK(t, env, "cp", a, id+":shadow")
		if out := ctlOK(t, env, "exec", id, "--", "bash", "-c", "test ! -L /workspace/shadow && cat /workspace/shadow && sha256sum /etc/shadow"); out != "alpha\n"+shadowSum {
			t.Errorf("after cp onto the link: got %q, want the link replaced by the file and /etc/shadow as it was (%q)", out, shadowSum)
		}
		// Another tenant sees nothing, either way.
		ctlFails(t, other, 69, "NOT_FOUND", "cp", id+":d/ok", stolen)
		ctlFails(t, other, 69, "NOT_FOUND", "cp", a, id+":x")
		if out := ctlOK(t, env, "exec", id, "--", "bash", "-c", "ls /workspace; test ! -e /workspace/x && test ! -e /escape && echo clean"); !strings.HasSuffix(out, "clean\n") {
			t.Errorf("the workspace after the refused writes: %q", out)
		}
	})

	e2e.Step(t, "huge-output", func(t *testing.T) {
		const n = 3000000 // seq 1 3000000: 20.9 MB
		cmd := exec.Command(bin, "exec", id, "--", "seq", "1", strconv.Itoa(n))
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		mustT(t, cmd.Start())
		// The peak is read from /proc while it runs: wait4's ru_maxrss is no measure here, since
		// the kernel starts it at the RSS of the memory the child was forked from (this test
		// binary's, over a GiB with the whole suite running in it).
		peak := e2e.PeakRSS(cmd.Process.Pid)
		// The stream keeps the newest 16 MiB of an exec's output: a reader that falls further
		// behind (the suite's load) is told so on stderr, and the hole may fall inside a line, so
		// that the line there joins the start of one number to the end of a later one. A break
		// is a line that does not follow the line before it: a hole makes at most two (the joined
		// line, and the first whole line after it), so more than two per hole said on stderr
		// (output lost unsaid, repeated or out of order) fail below.
		sc := bufio.NewScanner(stdout)
		last, breaks, total := 0, 0, 0
		for sc.Scan() {
			total += len(sc.Bytes()) + 1
			if len(sc.Bytes()) == 0 {
				// A hole that ends just before a newline: the joined line is empty.
				breaks++
				continue
			}
			v, err := strconv.Atoi(sc.Text())
			if err != nil {
				t.Fatalf("line %q after %d: not a number", sc.Text(), last)
			}
			if v != last+1 {
				breaks++
			}
			last = v
		}
		gaps := breaks
		rss := peak() >> 10 // before Wait: the process is still there to read, its output all read
		mustT(t, cmd.Wait())
		took := time.Since(start)
		t.Logf("seq 1 %d: %d bytes in %s (%.1f MB/s), %d gap(s), sandboxctl max RSS %d MiB", n, total, took.Round(time.Millisecond),
			float64(total)/took.Seconds()/1e6, gaps, rss)
		if last != n {
			t.Errorf("the output ended at %d, want %d", last, n)
		}
		if said := strings.Count(stderr.String(), "no longer kept"); breaks > 2*said {
			t.Errorf("%d break(s) in the output and %d hole(s) said on stderr %q: want at most two breaks per hole said",
				breaks, said, stderr.String())
		}
		if rss > 512 {
			t.Errorf("sandboxctl used %d MiB, want its memory bounded (it streams)", rss)
		}
	})

	e2e.Step(t, "stop-start-destroy", func(t *testing.T) {
		var sb client.Sandbox
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "stop", id, "-o", "json")), &sb))
		if sb.State != client.StateStopped || sb.LatestSnapshotID == "" {
			t.Errorf("stop: got %+v, want STOPPED with a snapshot", sb)
		}
		ctlFails(t, env, 69, "INVALID_STATE", "exec", id, "--", "true")
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "start", id, "-o", "json")), &sb))
		if sb.State != client.StateRunning {
			t.Errorf("start: got %+v, want RUNNING", sb)
		}
		if out := ctlOK(t, env, "exec", id, "--", "cat", "proj/a.txt"); out != "alpha\n" {
			t.Errorf("after stop and start: got %q, want the workspace kept", out)
		}
		if out := ctlOK(t, env, "snapshot", "list", id); !strings.Contains(out, sb.LatestSnapshotID) {
			t.Errorf("snapshot list: got %q, want %s", out, sb.LatestSnapshotID)
		}
		ctlFails(t, other, 69, "NOT_FOUND", "destroy", id)
		p := e2e.StartPTY(t, env, bin, "destroy", id)
		out, code := p.Wait(t, 2*time.Minute)
		if code != 0 || !strings.Contains(out, "state:") || !strings.Contains(out, "DESTROYED") || !strings.Contains(out, "snapshot_id:") {
			t.Errorf("destroy: exit %d, %q, want DESTROYED with its snapshot", code, out)
		}
	})
}

func writeFile(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	mustT(t, os.MkdirAll(filepath.Dir(p), 0o755))
	mustT(t, os.WriteFile(p, data, mode))
	mustT(t, os.Chmod(p, mode))
}

func mustT(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestSandboxctlLabels drives labels and update through the built sandboxctl against the built
// server on real runsc: create with labels, list filtered by them (ANDed), update (set, remove,
// clear, the deadlines), and what another tenant or a bad label gets.
func TestSandboxctlLabels(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	bin := e2e.Sandboxctl(t)
	env, other := s.CtlEnv(e2e.KeyTenant1), s.CtlEnv(e2e.KeyTenant2)

	var prod, dev string
	e2e.Step(t, "create-with-labels", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "create", "-q", "--label", "team=ml", "--label", "env=prod", "--label", "example.com/ticket=T-42")
		out, code := p.Wait(t, 3*time.Minute)
		prod = strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(prod, "sbx_") {
			t.Fatalf("create: exit %d, %q", code, out)
		}
		s.Track(prod, e2e.HdrTenant1)
		dev = strings.TrimSpace(ctlOK(t, env, "create", "-q", "--label", "team=ml", "--label", "env=dev"))
		s.Track(dev, e2e.HdrTenant1)
		if out := ctlOK(t, env, "get", prod); field(out, "labels") != "env=prod, example.com/ticket=T-42, team=ml" {
			t.Errorf("get: got %q, want its labels", out)
		}
	})

	ids := func(t *testing.T, env []string, args ...string) []string {
		t.Helper()
		var page client.Page
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, append([]string{"list", "-o", "json"}, args...)...)), &page))
		var out []string
		for _, sb := range page.Sandboxes {
			out = append(out, sb.ID)
		}
		return out
	}
	e2e.Step(t, "list-by-labels", func(t *testing.T) {
		if got := ids(t, env, "--label", "team=ml"); len(got) != 2 {
			t.Errorf("list --label team=ml: got %v, want both", got)
		}
		if got := ids(t, env, "--label", "team=ml", "--label", "env=prod"); len(got) != 1 || got[0] != prod {
			t.Errorf("list --label team=ml --label env=prod: got %v, want %s alone", got, prod)
		}
		if got := ids(t, env, "--label", "team=nobody"); len(got) != 0 {
			t.Errorf("list --label team=nobody: got %v, want none", got)
		}
		if got := ids(t, other, "--label", "team=ml"); len(got) != 0 {
			t.Errorf("another tenant's list --label team=ml: got %v, want none", got)
		}
		p := e2e.StartPTY(t, env, bin, "list", "--label", "env=prod")
		out, code := p.Wait(t, time.Minute)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 0 || len(lines) != 2 || !strings.HasSuffix(lines[0], "LABELS") || !strings.HasPrefix(lines[1], prod) ||
			!strings.HasSuffix(lines[1], "env=prod,example.com/ticket=T-42,team=ml") {
			t.Errorf("list --label env=prod on a terminal: exit %d, %q, want one row with its labels", code, out)
		}
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "list", "--label", "sandboxd.io/tenant=t2")
	})

	e2e.Step(t, "update", func(t *testing.T) {
		var before client.Sandbox
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "get", prod, "-o", "json")), &before))
		out := ctlOK(t, env, "update", prod, "--label", "env=staging", "--remove-label", "example.com/ticket", "--autostop-sec", "600", "--ttl-sec", "28800")
		wantExpiry := before.CreatedAt.Add(28800 * time.Second).UTC().Format(time.RFC3339)
		for name, want := range map[string]string{"labels": "env=staging, team=ml", "autostop_sec": "600", "ttl_sec": "28800", "expires_at": wantExpiry} {
			if got := field(out, name); got != want {
				t.Errorf("update printed %s %q, want %q (all: %q)", name, got, want, out)
			}
		}
		at, err := time.Parse(time.RFC3339, field(out, "autostop_at"))
		if err != nil || at.Sub(time.Now().Add(600*time.Second)).Abs() > time.Minute {
			t.Errorf("autostop_at %q (%v), want about 600 s from now", field(out, "autostop_at"), err)
		}
		if got := ids(t, env, "--label", "env=staging"); len(got) != 1 || got[0] != prod {
			t.Errorf("list --label env=staging after the update: got %v, want %s", got, prod)
		}
		var sb client.Sandbox
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "update", prod, "--clear-labels", "--label", "owner=alice", "-o", "json")), &sb))
		if len(sb.Labels) != 1 || sb.Labels["owner"] != "alice" {
			t.Errorf("update --clear-labels --label owner=alice: got %v, want owner=alice alone", sb.Labels)
		}
		var cleared client.Sandbox
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "update", dev, "--clear-labels", "-o", "json")), &cleared))
		if cleared.ID != dev || len(cleared.Labels) != 0 {
			t.Errorf("update --clear-labels: got %s with %v, want %s with none", cleared.ID, cleared.Labels, dev)
		}
	})

	e2e.Step(t, "hostile", func(t *testing.T) {
		ctlFails(t, other, 69, "NOT_FOUND", "update", prod, "--label", "owner=mallory")
		ctlFails(t, other, 69, "NOT_FOUND", "update", prod, "--clear-labels", "--label", "owner=mallory")
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "update", prod, "--label", "sandboxd.io/tenant=t2")
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "update", prod, "--label", "bad key=x")
		// A ttl_sec of 1 ends the sandbox's life before now once it is over a second old (a
		// fast run reaches this step sooner).
		if age := time.Since(s.Get(t, prod, e2e.HdrTenant1).CreatedAt); age < 1500*time.Millisecond {
			time.Sleep(1500*time.Millisecond - age)
		}
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "update", prod, "--ttl-sec", "1")
		many := []string{"update", prod}
		for i := range 33 {
			many = append(many, "--label", "k"+strconv.Itoa(i)+"=v")
		}
		ctlFails(t, env, 69, "INVALID_ARGUMENT", many...)
		// An escape sequence as a label value is refused, and what is printed carries no escape.
		errOut := ctlFails(t, env, 69, "INVALID_ARGUMENT", "update", prod, "--label", "k=\x1b]0;pwned\x07")
		if strings.ContainsRune(errOut, 0x1b) {
			t.Errorf("the error printed %q, want no raw escape", errOut)
		}
		var sb client.Sandbox
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "get", prod, "-o", "json")), &sb))
		if len(sb.Labels) != 1 || sb.Labels["owner"] != "alice" || sb.TTLSec != 28800 {
			t.Errorf("after the refused updates: got labels %v and ttl %d, want owner=alice and 28800", sb.Labels, sb.TTLSec)
		}
	})
}

// field is the value of a "name:  value" line of sandboxctl's text output, "" when there is none.
func field(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
