package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sandboxd/tests/kubeenv/internal/runsc"
)

// child is one program of the cluster, run as a child process with its output in a log file.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process exited
	err     error         // its exit, valid after done
	stopped bool          // the supervisor stopped it (its exit is expected)
}

// stopGrace is how long a child gets after SIGTERM before SIGKILL.
const stopGrace = 5 * time.Second

// startChild starts bin with args, its stdout and stderr appended to logDir/name.log. The
// child gets its own process group (a terminal's Ctrl-C reaches only the supervisor, which
// stops the children in order) and deathSig when the supervisor dies: the kernel kills it
// then, so a killed supervisor leaves nothing running. Must be called from the main
// goroutine (locked to the main thread: the death signal follows the thread that forked).
func startChild(name, bin, logDir string, deathSig syscall.Signal, args ...string) (*child, error) {
	logPath := filepath.Join(logDir, name+".log")
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	defer log.Close()
	fmt.Fprintf(log, "--- %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the child's process has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends the child by its pid: SIGTERM, then SIGKILL after grace. It returns once the
// process is reaped.
func (c *child) stop(grace time.Duration) {
	c.stopped = true
	if c.exited() {
		return
	}
	_ = syscall.Kill(c.pid(), syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	logf("%s (pid %d) did not stop within %s: SIGKILL", c.name, c.pid(), grace)
	_ = syscall.Kill(c.pid(), syscall.SIGKILL)
	<-c.done
}

// tail returns about the last n bytes of the child's log, from a line start.
func (c *child) tail(n int64) string { return runsc.LogTail(c.logPath, n) }
