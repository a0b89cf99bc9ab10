package tests

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

// TestSandboxctlFiles drives rm, mv, mkdir, stat and watch through the built sandboxctl
// against the built server on real runsc, with what a hostile sandbox or tenant tries.
func TestSandboxctlFiles(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	bin := e2e.Sandboxctl(t)
	env, other := s.CtlEnv(e2e.KeyTenant1), s.CtlEnv(e2e.KeyTenant2)
	id := ctlCreate(t, s, env, e2e.HdrTenant1)

	e2e.Step(t, "mkdir-stat-mv-rm", func(t *testing.T) {
		ctlOK(t, env, "mkdir", id+":a/b/c", id+":empty")
		ctlOK(t, env, "mkdir", id+":a/b") // exists: fine
		var fi client.FileInfo
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "stat", id+":a/b/c", "-o", "json")), &fi))
		if fi.Type != "DIRECTORY" || fi.Path != "/workspace/a/b/c" {
			t.Errorf("stat a/b/c: got %+v, want a DIRECTORY", fi)
		}
		ctl(t, env, "hello\n", "cp", "-", id+":a/b/c/f.txt")
		ctlOK(t, env, "mv", id+":a/b/c/f.txt", "a/g.txt")
		out := ctlOK(t, env, "stat", id+":a/g.txt")
		if field(out, "type") != "FILE" || field(out, "size") != "6 (6 B)" || field(out, "path") != "/workspace/a/g.txt" {
			t.Errorf("stat a/g.txt: %q", out)
		}
		ctl(t, env, "x", "cp", "-", id+":a/h.txt")
		ctlFails(t, env, 69, "ALREADY_EXISTS", "mv", id+":a/h.txt", id+":a/g.txt")
		ctlOK(t, env, "mv", "-f", id+":a/h.txt", id+":a/g.txt")
		ctlFails(t, env, 69, "DIRECTORY_NOT_EMPTY", "rm", id+":a")
		ctlOK(t, env, "rm", id+":empty")
		ctlOK(t, env, "rm", "-r", id+":a")
		ctlFails(t, env, 69, "NOT_FOUND", "stat", id+":a")
		ctlFails(t, env, 69, "NOT_FOUND", "stat", id+":empty")
		// cp makes a local folder's empty folders too, and copies a special file out never.
		local := t.TempDir()
		mustT(t, os.MkdirAll(filepath.Join(local, "tree", "empty", "deeper"), 0o755))
		if out := ctlOK(t, env, "cp", filepath.Join(local, "tree"), id+":"); !strings.Contains(out, "copied 0 file(s), 0 B, and 3 folder(s)") {
			t.Errorf("cp of empty folders: %q, want 3 folders made", out)
		}
		if out := ctlOK(t, env, "stat", id+":tree/empty/deeper"); field(out, "type") != "DIRECTORY" {
			t.Errorf("stat tree/empty/deeper after cp: %q, want a DIRECTORY", out)
		}
		ctlOK(t, env, "exec", id, "--", "mkfifo", "/workspace/pipe")
		ctlFails(t, env, 74, "pipe: is a fifo; cp copies files and folders", "cp", id+":pipe", filepath.Join(local, "pipe"))
		ctlFails(t, env, 64, "wants SANDBOX:PATH", "rm", "local-file")
		ctlFails(t, env, 64, "within one sandbox", "mv", id+":x", "sbx_other:y")
	})

	e2e.Step(t, "hostile", func(t *testing.T) {
		ctlOK(t, env, "exec", id, "--", "bash", "-c", `set -e; ln -s /etc /workspace/etc; ln -s /etc/shadow /workspace/shadow
mkdir -p /workspace/d; touch "/workspace/d/$(printf 'evil\033]0;pwned\007')"`)
		before := ctlOK(t, env, "exec", id, "--", "bash", "-c", "sha256sum /etc/shadow; ls /etc | wc -l")
		// A link is itself: stat tells its target, rm removes the link, never what it points to.
		out := ctlOK(t, env, "stat", id+":shadow")
		if field(out, "type") != "SYMLINK" || field(out, "symlink") != "/etc/shadow" {
			t.Errorf("stat of a link: %q, want SYMLINK to /etc/shadow", out)
		}
		ctlOK(t, env, "rm", id+":shadow")
		for _, args := range [][]string{
			{"rm", "-r", id + ":etc/passwd"}, {"rm", id + ":../etc/passwd"}, {"rm", "-r", id + ":/etc"},
			{"mv", id + ":etc/passwd", id + ":stolen"}, {"mv", id + ":d", id + ":../d"}, {"mv", id + ":d", id + ":etc/d"},
			{"mkdir", id + ":etc/evil"}, {"mkdir", id + ":../evil"}, {"stat", id + ":etc/shadow"}, {"watch", id + ":etc"},
		} {
			ctlFails(t, env, 69, "INVALID_ARGUMENT", args...)
		}
		if after := ctlOK(t, env, "exec", id, "--", "bash", "-c", "sha256sum /etc/shadow; ls /etc | wc -l"); after != before {
			t.Errorf("/etc after the refused calls: %q, want %q", after, before)
		}
		// rm -r of the link with a trailing slash removes the link, never the folder it names.
		ctlOK(t, env, "rm", "-r", id+":etc/")
		ctlFails(t, env, 69, "NOT_FOUND", "stat", id+":etc")
		if after := ctlOK(t, env, "exec", id, "--", "bash", "-c", "sha256sum /etc/shadow; ls /etc | wc -l"); after != before {
			t.Errorf("/etc after rm -r of a link to it: %q, want %q", after, before)
		}
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "rm", "-r", id+":/workspace")
		// Names the sandbox chose are quoted outside a terminal session.
		out = ctlOK(t, env, "stat", id+":d/evil\x1b]0;pwned\x07")
		if strings.ContainsRune(out, 0x1b) || field(out, "path") != `"/workspace/d/evil\x1b]0;pwned\a"` {
			t.Errorf("stat of a name with escapes: %q, want it quoted", out)
		}
		// Another tenant sees nothing.
		for _, args := range [][]string{{"stat", id + ":d"}, {"rm", "-r", id + ":d"}, {"mv", id + ":d", "e"}, {"mkdir", id + ":x"}, {"watch", id + ":"}} {
			ctlFails(t, other, 69, "NOT_FOUND", args...)
		}
		ctlOK(t, env, "stat", id+":d")
	})

	e2e.Step(t, "watch-and-resume", func(t *testing.T) {
		ctlOK(t, env, "mkdir", id+":w")
		p := e2e.StartPTY(t, env, bin, "watch", id+":w", "-r")
		time.Sleep(time.Second) // the watch is set up before the first change
		ctlOK(t, env, "exec", id, "--", "bash", "-c", `cd /workspace/w; mkdir sub; echo 1 > sub/a.txt; mv sub/a.txt b.txt; rm b.txt
touch "$(printf 'x\033[2Jy')"`)
		p.WaitFor(t, `CREATED   "w/x\x1b[2Jy"`, time.Minute)
		p.Type(t, "\x03")
		out, code := p.Wait(t, time.Minute)
		m := regexp.MustCompile(`stopped; resume: (sandboxctl watch \S+ -r --after (\S+))\n`).FindStringSubmatch(out)
		if code != 130 || m == nil {
			t.Fatalf("Ctrl-C: exit %d, %q, want 130 and how to resume", code, out)
		}
		for _, re := range []string{`CREATED\s+w/sub/\n`, `CREATED\s+w/sub/a.txt\n`, `MOVED\s+w/sub/a.txt -> w/b.txt\n`, `DELETED\s+w/b.txt\n`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("watch printed %q, want a line matching %s", out, re)
			}
		}
		if strings.ContainsRune(out, 0x1b) {
			t.Errorf("watch printed a raw escape: %q", out)
		}
		// Resume after the cursor: only what happened since, as JSON lines.
		ctlOK(t, env, "exec", id, "--", "bash", "-c", "echo 2 > /workspace/w/c.txt")
		cmd := exec.Command(bin, "watch", id+":w", "-r", "--after", m[2], "-o", "json")
		cmd.Env = env
		stdout, err := cmd.StdoutPipe()
		mustT(t, err)
		mustT(t, cmd.Start())
		defer cmd.Process.Kill()
		dec := json.NewDecoder(stdout)
		var ev struct{ Event, Path, Cursor string }
		mustT(t, dec.Decode(&ev))
		if ev.Event != "created" || ev.Path != "w/c.txt" {
			t.Errorf("the first event after the cursor: %+v, want CREATED w/c.txt", ev)
		}
		mustT(t, cmd.Process.Signal(os.Interrupt))
		var stopped struct{ Event, Path, Cursor string }
		for stopped.Event != "stopped" {
			stopped.Event, stopped.Path = "", ""
			if err := dec.Decode(&stopped); err != nil {
				t.Fatalf("after Ctrl-C: %v, want a stopped line", err)
			}
			if stopped.Path != "" && stopped.Path != "w/c.txt" {
				t.Errorf("after the cursor: an event of %s, want w/c.txt's alone", stopped.Path)
			}
		}
		if stopped.Cursor == "" {
			t.Error("the stopped line has no cursor")
		}
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("watch -o json after Ctrl-C: %v, want exit 130", err)
		}
		ctlFails(t, other, 69, "NOT_FOUND", "watch", id+":w", "--after", m[2])
	})
}
