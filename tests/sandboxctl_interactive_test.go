package tests

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"sandboxd/client"
	"sandboxd/tests/e2e"
)

// TestSandboxctlTerminal is the terminal sequence through the built sandboxctl on a
// pseudo-terminal, against the built server on real runsc: bash -i under a terminal, stty size
// and arithmetic, a window resize that reaches the sandbox, the detach key, a reattach after
// the cursor and one that replays everything, and the shell's exit code as sandboxctl's.
func TestSandboxctlTerminal(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	bin := e2e.Sandboxctl(t)
	env, other := s.CtlEnv(e2e.KeyTenant1), s.CtlEnv(e2e.KeyTenant2)
	id := ctlCreate(t, s, env, e2e.HdrTenant1)

	var execID, cursor string
	e2e.Step(t, "bash-stty-size-resize-detach", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "terminal", id, "--", "bash", "-i")
		p.WaitFor(t, "Ctrl-] detaches", time.Minute)
		p.Type(t, "stty size; echo $((6*7))\r")
		p.WaitFor(t, "24 80\n42\n", time.Minute)
		p.Resize(t, 40, 120)
		// The resize travels SIGWINCH → sandboxctl → the server → the sandbox's terminal.
		mark := len(p.Output())
		e2e.Eventually(t, 30*time.Second, "the new size in the sandbox", func() (bool, string) {
			p.Type(t, "stty size\r")
			time.Sleep(300 * time.Millisecond)
			return strings.Contains(p.Since(mark), "40 120\n"), p.Since(mark)
		})
		// A sandbox's escape sequences reach the user's terminal as they are, in terminal mode.
		p.Type(t, `printf '\033]0;sbx-title\007marker-%s\n' $((2*21))`+"\r")
		p.WaitFor(t, "\x1b]0;sbx-title\x07marker-42\n", time.Minute)
		p.Type(t, "\x1d")
		out, code := p.Wait(t, time.Minute)
		m := regexp.MustCompile(`reattach: sandboxctl terminal --attach (exec_\w+) \(replays its output; add --after (\S+) for what follows only\)\n`).FindStringSubmatch(out)
		if code != 130 || !strings.Contains(out, "detached; ") || m == nil {
			t.Fatalf("the detach key: exit %d, %q, want 130 and how to reattach", code, out)
		}
		execID, cursor = m[1], m[2]
		// The shell runs on, at its new size.
		var page struct {
			Execs []struct {
				ExecID string          `json:"exec_id"`
				Tty    *client.TtySize `json:"tty"`
			} `json:"execs"`
		}
		mustT(t, json.Unmarshal([]byte(ctlOK(t, env, "execs", id, "--state", "RUNNING", "-o", "json")), &page))
		if len(page.Execs) != 1 || page.Execs[0].ExecID != execID || page.Execs[0].Tty == nil || *page.Execs[0].Tty != (client.TtySize{Rows: 40, Cols: 120}) {
			t.Errorf("execs --state RUNNING after the detach: got %+v, want %s at 40x120", page.Execs, execID)
		}
	})

	e2e.Step(t, "reattach-after-the-cursor", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "terminal", "--attach", execID, "--after", cursor)
		p.WaitFor(t, "Ctrl-] detaches", time.Minute)
		// Reattached at 24x80, sandboxctl sets the sandbox's terminal to its own size.
		mark := len(p.Output())
		e2e.Eventually(t, 30*time.Second, "the reattached size", func() (bool, string) {
			p.Type(t, "stty size; echo after-$((5*5))\r")
			time.Sleep(300 * time.Millisecond)
			return strings.Contains(p.Since(mark), "24 80\nafter-25\n"), p.Since(mark)
		})
		p.Type(t, "\x1d")
		out, code := p.Wait(t, time.Minute)
		if code != 130 || strings.Contains(out, "42\n") {
			t.Errorf("reattach --after: exit %d, %q, want 130 and nothing from before the cursor", code, out)
		}
	})

	e2e.Step(t, "reattach-replays-and-exit-code", func(t *testing.T) {
		ctlFails(t, other, 69, "NOT_FOUND", "terminal", "--attach", execID)
		p := e2e.StartPTY(t, env, bin, "terminal", "--attach", execID)
		p.WaitFor(t, "after-25\n", time.Minute)
		replay := p.Output()
		for _, want := range []string{"24 80\n42\n", "40 120\n", "marker-42\n", "after-25\n"} {
			if !strings.Contains(replay, want) {
				t.Errorf("the replay lacks %q: %q", want, replay)
			}
		}
		p.Type(t, "exit 7\r")
		out, code := p.Wait(t, time.Minute)
		if code != 7 {
			t.Errorf("exit 7 in the shell: sandboxctl exited %d (%q), want 7", code, out)
		}
		// An ended terminal replays and answers its exit code again.
		if _, _, code := ctl(t, env, "", "terminal", "--attach", execID); code != 7 {
			t.Errorf("attaching to the ended terminal: exit %d, want 7", code)
		}
	})

	e2e.Step(t, "hostile-flood", func(t *testing.T) {
		// 20 MB of output as fast as the sandbox can make it: the terminal keeps up or says
		// nothing breaks; sandboxctl's memory stays bounded (its output buffer is 4 MiB).
		const n = 20_000_000
		p := e2e.StartPTY(t, env, bin, "terminal", id, "--", "bash", "-c", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; printf '\033[2J\033]0;owned\007\n'; exit 5`, n))
		start := time.Now()
		out, code := p.Wait(t, 3*time.Minute)
		got := 0
		if i, j := strings.Index(out, "detaches\n"), strings.Index(out, "\x1b[2J"); i >= 0 && j > i {
			got = strings.Count(out[i+len("detaches\n"):j], "x")
		}
		t.Logf("terminal flood: %d of %d bytes shown in %s, sandboxctl max RSS %d MiB", got, n, time.Since(start).Round(time.Millisecond), p.MaxRSS()>>10)
		if code != 5 || got == 0 || got > n || !strings.Contains(out, "\x1b[2J\x1b]0;owned\x07") {
			t.Errorf("flood: exit %d with %d bytes, want 5 and the output, escapes as they are", code, got)
		}
		if rss := p.MaxRSS() >> 10; rss > 512 {
			t.Errorf("sandboxctl used %d MiB, want its memory bounded", rss)
		}
	})

	e2e.Step(t, "default-shell-and-ctrl-c-goes-to-the-sandbox", func(t *testing.T) {
		p := e2e.StartPTY(t, env, bin, "terminal", id)
		p.WaitFor(t, "Ctrl-] detaches", time.Minute)
		p.Type(t, "sleep 100\r")
		time.Sleep(time.Second)
		p.Type(t, "\x03") // Ctrl-C: the sandbox's sleep gets it, not sandboxctl
		p.Type(t, "echo alive-$((3*3)) $0\r")
		p.WaitFor(t, "alive-9 ", time.Minute)
		p.Type(t, "exit\r")
		out, code := p.Wait(t, time.Minute)
		if code != 0 {
			t.Errorf("exit after an echo: got %d (%q), want the shell's status, 0", code, out)
		}
		// The passwd database's shell for root, as a login shell (it says logout).
		if !strings.Contains(out, "alive-9 /bin/bash\n") || !strings.Contains(out, "logout\n") {
			t.Errorf("the default shell: %q, want bash as a login shell", out)
		}
	})
}

// TestSandboxctlProcess drives execs, signal and exec -i through the built sandboxctl against
// the built server on real runsc.
func TestSandboxctlProcess(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{State: e2e.NewStateDir(t)})
	bin := e2e.Sandboxctl(t)
	env, other := s.CtlEnv(e2e.KeyTenant1), s.CtlEnv(e2e.KeyTenant2)
	id := ctlCreate(t, s, env, e2e.HdrTenant1)

	e2e.Step(t, "execs-and-signal", func(t *testing.T) {
		execID := strings.TrimSpace(ctlOK(t, env, "exec", "-d", id, "--", "bash", "-c", `trap 'echo got TERM; exit 9' TERM; sleep 300 & wait`))
		done := strings.TrimSpace(ctlOK(t, env, "exec", "-d", id, "--", "true"))
		e2e.Eventually(t, 30*time.Second, "the short exec ended", func() (bool, string) {
			out := ctlOK(t, env, "execs", id, "--state", "ENDED", "-q")
			return strings.Contains(out, done), out
		})
		if out := ctlOK(t, env, "execs", id, "--state", "RUNNING", "-q"); out != execID+"\n" {
			t.Errorf("execs --state RUNNING -q: got %q, want %s alone", out, execID)
		}
		p := e2e.StartPTY(t, env, bin, "execs", id)
		out, _ := p.Wait(t, time.Minute)
		if !regexp.MustCompile(execID+`\s+RUNNING\s+-\s+\S+\s+-\s+bash -c`).MatchString(out) || !regexp.MustCompile(done+`\s+ENDED\s+0\s`).MatchString(out) {
			t.Errorf("execs: %q, want both with their state and exit", out)
		}
		ctlFails(t, other, 69, "NOT_FOUND", "signal", execID, "SIGKILL")
		ctlFails(t, other, 69, "NOT_FOUND", "execs", id)
		ctlFails(t, env, 69, "INVALID_ARGUMENT", "signal", execID, "SIGFOO")
		ctlFails(t, env, 64, "no signal numbered", "signal", execID, "99")
		if out := ctlOK(t, env, "signal", execID, "term"); !strings.Contains(out, "sent SIGTERM to "+execID) {
			t.Errorf("signal term: %q", out)
		}
		out, errOut, code := ctl(t, env, "", "logs", execID, "--follow")
		if code != 9 || !strings.Contains(out, "got TERM") {
			t.Errorf("logs --follow after SIGTERM: exit %d, %q / %q, want 9 and the trap's line", code, out, errOut)
		}
		if out := ctlOK(t, env, "execs", id, "--state", "RUNNING", "-q"); out != "" {
			t.Errorf("execs --state RUNNING after the signal: %q, want none (the sleep went with the tree)", out)
		}
		ctlFails(t, env, 69, "INVALID_STATE", "signal", execID, "SIGKILL")
		// SIGKILL to a tree that ignores TERM: 137.
		execID = strings.TrimSpace(ctlOK(t, env, "exec", "-d", id, "--", "bash", "-c", `trap '' TERM; sleep 300`))
		ctlOK(t, env, "signal", execID, "9")
		if _, _, code := ctl(t, env, "", "logs", execID, "--follow"); code != 137 {
			t.Errorf("after SIGKILL: exit %d, want 137", code)
		}
	})

	e2e.Step(t, "exec-stdin-streams-3-MiB", func(t *testing.T) {
		blob := make([]byte, 3<<20)
		rand.Read(blob)
		want := sha256hex(blob)
		for _, tt := range []struct{ name, script string }{
			{"fast-reader", "sha256sum"},
			// A reader that waits first: the server's 1 MiB stdin buffer fills, sandboxctl waits.
			{"slow-reader", "sleep 3; sha256sum"},
		} {
			cmd := exec.Command(bin, "exec", "-i", id, "--", "bash", "-c", tt.script)
			cmd.Env = env
			cmd.Stdin = bytes.NewReader(blob)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v: %s", tt.name, err, stderr.String())
			}
			if got := strings.Fields(stdout.String()); len(got) == 0 || got[0] != want {
				t.Errorf("%s: the sandbox hashed %q, want %s", tt.name, stdout.String(), want)
			}
			t.Logf("exec -i, %s: 3 MiB in %s", tt.name, time.Since(start).Round(time.Millisecond))
		}
		// A command that stops reading: sandboxctl ends with the command, not stuck on input.
		_, _, code := ctl(t, env, strings.Repeat("y\n", 2<<20), "exec", "-i", id, "--", "bash", "-c", "head -c 10 >/dev/null; exit 4")
		if code != 4 {
			t.Errorf("a command that reads 10 bytes of 4 MiB: exit %d, want 4", code)
		}
	})
}
