package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// sandboxctlBuild is the sandboxctl binary, built on first use.
var sandboxctlBuild struct {
	sync.Once
	path string
	err  error
}

// Sandboxctl builds cmd/sandboxctl once per go test run (with -race when the tests run with
// it, like sandboxd) and answers its path.
func Sandboxctl(t testing.TB) string {
	t.Helper()
	sandboxctlBuild.Do(func() {
		p := filepath.Join(suite.root, "bin", "sandboxctl")
		args := []string{"build", "-o", p}
		if suite.race && os.Getenv("SANDBOXD_E2E_RACE") != "0" {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/sandboxctl")...)
		cmd.Dir = suite.modRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			sandboxctlBuild.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			return
		}
		sandboxctlBuild.path = p
	})
	if sandboxctlBuild.err != nil {
		t.Fatal(sandboxctlBuild.err)
	}
	return sandboxctlBuild.path
}

// CtlEnv is the environment of a sandboxctl run against s with key: the gateway and key
// variables, PATH and HOME, nothing else of the test's. The gateway is a proxy to s in the test
// process that checks the REST exchanges against the server's OpenAPI document (openapi.go).
func (s *Server) CtlEnv(key string) []string {
	return []string{"SANDBOX_GATEWAY_URL=" + s.checkedGateway(), "SANDBOX_API_KEY=" + key, "PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
}

// PTY is a program running on a pseudo-terminal of 24 rows and 80 columns, as a user's shell
// runs it: its session leader and the terminal's foreground process group, so Ctrl-C written
// to the terminal is its SIGINT. Everything it writes (stdout and stderr both) is kept, with
// the terminal's "\r\n" turned into "\n".
type PTY struct {
	cmd  *exec.Cmd
	tty  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	read chan struct{} // closed when the terminal has nothing more to read
	done chan struct{} // closed when the program ended
	err  error
	peak func() int64 // PeakRSS of the program
}

// StartPTY starts bin with args and env on a new pseudo-terminal. The program is killed when
// the test ends, if it still runs.
func StartPTY(t testing.TB, env []string, bin string, args ...string) *PTY {
	t.Helper()
	p := &PTY{cmd: exec.Command(bin, args...), read: make(chan struct{}), done: make(chan struct{})}
	p.cmd.Env = env
	tty, err := pty.StartWithSize(p.cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	p.tty, p.peak = tty, PeakRSS(p.cmd.Process.Pid)
	go func() {
		defer close(p.read)
		buf := make([]byte, 32<<10)
		for {
			n, err := tty.Read(buf)
			p.mu.Lock()
			p.out.Write(bytes.ReplaceAll(buf[:n], []byte("\r\n"), []byte("\n")))
			p.mu.Unlock()
			if err != nil { // EIO once the program and its children closed the terminal
				return
			}
		}
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		tty.Close()
	})
	return p
}

// Output is what the program wrote so far.
func (p *PTY) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// WaitFor waits until the output holds s, failing t after timeout.
func (p *PTY) WaitFor(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), s) {
		select {
		case <-p.done:
			<-p.read
			if !strings.Contains(p.Output(), s) {
				t.Fatalf("the program ended (%v) without writing %q; it wrote:\n%s", p.err, s, p.Output())
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within %s; the program wrote:\n%s", s, timeout, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Type writes s to the terminal, as typed keys (Ctrl-C is "\x03").
func (p *PTY) Type(t testing.TB, s string) {
	t.Helper()
	if _, err := io.WriteString(p.tty, s); err != nil {
		t.Fatal(err)
	}
}

// Wait waits for the program to end (failing t after timeout) and answers all it wrote and its
// exit code (128+N when signal N ended it).
func (p *PTY) Wait(t testing.TB, timeout time.Duration) (string, int) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("the program still runs after %s; it wrote:\n%s", timeout, p.Output())
	}
	select {
	case <-p.read:
	case <-time.After(5 * time.Second): // a child left holding the terminal: answer what came
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	} else if p.err != nil {
		t.Fatal(p.err)
	}
	return p.Output(), code
}

// Resize sets the terminal's size, as a user resizing the window: the program (the terminal's
// foreground process group) gets SIGWINCH.
func (p *PTY) Resize(t testing.TB, rows, cols int) {
	t.Helper()
	if err := pty.Setsize(p.tty, &pty.Winsize{Rows: uint16(rows), Cols: uint16(cols)}); err != nil {
		t.Fatal(err)
	}
}

// Since is what the program wrote after the first n bytes of Output.
func (p *PTY) Since(n int) string {
	out := p.Output()
	return out[min(n, len(out)):]
}

// MaxRSS is the program's peak resident memory in KiB, once it ended (0 before), as PeakRSS
// sampled it while it ran.
func (p *PTY) MaxRSS() int64 {
	select {
	case <-p.done:
	default:
		return 0
	}
	return p.peak()
}

// PeakRSS samples the high-water mark of pid's resident memory (VmHWM in /proc/<pid>/status,
// in KiB) every 10 ms until the function it returns is called, which answers the largest value
// seen (reading once more if the process is still there). wait4's ru_maxrss is no measure of a
// program a test started: the kernel starts it at the RSS of the memory the child was forked
// from, the test binary's, which is over a GiB when the whole suite runs in it.
func PeakRSS(pid int) func() int64 {
	var mu sync.Mutex
	var peak int64
	sample := func() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				mu.Lock()
				peak = max(peak, kb)
				mu.Unlock()
			}
		}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	var once sync.Once
	return func() int64 {
		once.Do(func() {
			close(done)
			<-stopped
			sample()
		})
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}
