// Package shim is the node's per-container shim: a small process (the node's own binary run
// as `vknode shim …`) that creates one container (runsc or runc, package engine) and stays
// the parent of its process, so it learns the container's exit status.
//
// Why: runsc reports a container's exit status through `runsc wait`, which asks the sandbox;
// the sandbox exits together with its root container, and when it is gone first (a fast
// exit, a kill, an OOM kill) only the sandbox process's parent can still get the status
// (runsc itself says "sandbox no longer running and its exit status is unavailable"). After
// `runsc create` exits, its sandbox and gofer are reparented to the nearest child subreaper:
// the shim is one. It reaps them, and when the sandbox ends it writes the exit status (the
// sandbox's, which is the container's) and the memory cgroup's OOM verdict to a file, then
// exits. The node runs `runsc start` itself once the shim reported the container created.
//
// runc containers work the same way: `runc create` exits once the container's init waits
// for `runc start`, and the init (made with CLONE_PARENT, so runc create's child) is
// reparented to the shim. Its exit status is the container's; when it ends, the kernel kills
// every other process of the container's pid namespace.
//
// When the node dies, the shim gets SIGTERM (its parent-death signal) and deletes the
// container, so no sandbox outlives the node.
package shim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"sandboxd/tests/kubeenv/internal/engine"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// Status is how a container ended, as the shim writes it.
type Status struct {
	// ExitCode is the container's exit code; 128+n when it was killed by signal n.
	ExitCode int `json:"exitCode"`
	// Signal is the signal that ended the sandbox, 0 if it exited.
	Signal int `json:"signal,omitempty"`
	// OOMKilled is set when the container's memory cgroup counted an OOM kill.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// Error is set when the container could not be created.
	Error string `json:"error,omitempty"`
}

// Subcommand is the first argument that makes the node's binary run as a shim.
const Subcommand = "shim"

// Config is what the node gives a shim.
type Config struct {
	// Self is the node's binary (it runs `Self shim …`).
	Self string
	// Engine is the container's runtime (its binary, root and global flags are passed on).
	Engine engine.Engine
	// Bundle is the container's OCI bundle folder; ID its container id.
	Bundle, ID string
	// Log receives the container's stdout and stderr (and runsc create's output).
	Log string
	// StatusFile is where the shim writes the Status.
	StatusFile string
	// ShimLog receives the shim's own messages.
	ShimLog string
}

// Process is a running shim.
type Process struct {
	cfg  Config
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a shim and waits until it reports the container created (the node then runs
// `runsc start`). On failure the shim has exited and left no container.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	args := append([]string{Subcommand}, cfg.Engine.ShimArgs()...)
	args = append(args, "--bundle="+cfg.Bundle, "--id="+cfg.ID, "--log="+cfg.Log, "--status="+cfg.StatusFile)
	shimLog, err := os.OpenFile(cfg.ShimLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("shim log: %w", err)
	}
	defer shimLog.Close()
	_ = os.Remove(cfg.StatusFile)
	cmd := exec.Command(cfg.Self, args...)
	cmd.Stderr = shimLog
	// Its own process group (signals to the node's group do not reach it); SIGTERM when the
	// node dies: it then deletes its container.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var startErr error
	onSpawnerThread(func() { startErr = cmd.Start() })
	if startErr != nil {
		return nil, fmt.Errorf("start shim: %w", startErr)
	}
	p := &Process{cfg: cfg, cmd: cmd, done: make(chan struct{})}
	created := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && strings.HasPrefix(line, "created") {
			created <- nil
		} else {
			created <- errors.New("shim exited before the container was created")
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(p.done)
	}()
	select {
	case err := <-created:
		if err != nil {
			<-p.done
			st, serr := p.status()
			if serr == nil && st.Error != "" {
				return nil, errors.New(st.Error)
			}
			return nil, fmt.Errorf("%w (shim log %s)", err, cfg.ShimLog)
		}
		return p, nil
	case <-ctx.Done():
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM) // the shim deletes the container
		<-p.done
		return nil, ctx.Err()
	}
}

// spawns runs functions on the spawner goroutine, locked to one OS thread for the life of
// the process: a child's parent-death signal (Pdeathsig) is tied to the thread that forked
// it, and a shim must only get it when the node dies, never when some thread ends.
var spawns = make(chan func())

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the process
		for f := range spawns {
			f()
		}
	}()
}

// onSpawnerThread runs f on the spawner thread and waits for it.
func onSpawnerThread(f func()) {
	done := make(chan struct{})
	spawns <- func() { defer close(done); f() }
	<-done
}

// Done is closed when the shim has exited (its container ended).
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the container to end and returns its status. err is set when the shim
// left no status (it was killed itself).
func (p *Process) Wait() (Status, error) {
	<-p.done
	return p.status()
}

func (p *Process) status() (Status, error) {
	var st Status
	b, err := os.ReadFile(p.cfg.StatusFile)
	if err != nil {
		return st, fmt.Errorf("container %s: no exit status from its shim: %w", p.cfg.ID, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("container %s: exit status file: %w", p.cfg.ID, err)
	}
	return st, nil
}

// Main is the shim process: `vknode shim --handler … --runtime … --root … --bundle … --id …
// --log … --status …` (engine.Flags). It returns the process's exit code.
func Main(args []string) int {
	fs := flag.NewFlagSet(Subcommand, flag.ContinueOnError)
	var ef engine.Flags
	ef.Register(fs)
	bundle := fs.String("bundle", "", "OCI bundle folder")
	id := fs.String("id", "", "container id")
	logPath := fs.String("log", "", "container log file")
	statusPath := fs.String("status", "", "exit status file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	eng, err := ef.Engine()
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim: %v\n", err)
		return 2
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s shim %s: %s\n", time.Now().UTC().Format(time.RFC3339Nano), *id, fmt.Sprintf(format, a...))
	}
	writeStatus := func(st Status) {
		b, _ := json.Marshal(st)
		tmp := *statusPath + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err == nil {
			err = os.Rename(tmp, *statusPath)
		}
	}
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		logf("%s", msg)
		writeStatus(Status{ExitCode: 128, Error: msg})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = eng.Destroy(ctx, *id, *bundle)
		return 1
	}
	if *bundle == "" || *id == "" || *logPath == "" || *statusPath == "" {
		fmt.Fprintln(os.Stderr, "shim: --bundle, --id, --log and --status are required")
		return 2
	}
	// Orphans of the processes it starts (runsc create's sandbox and gofer) become its children.
	if err := setChildSubreaper(); err != nil {
		return fail("prctl(PR_SET_CHILD_SUBREAPER): %v", err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)

	log, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fail("container log: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	sandboxPid, cgroup, err := eng.Create(ctx, log, *bundle, *id)
	cancel()
	log.Close()
	if err != nil {
		return fail("create container: %v: %s", err, runsc.LogLine(*logPath, 600))
	}
	// sandboxPid is runsc's sandbox or runc's container init: the process whose status is
	// the container's.
	fmt.Fprintf(os.Stdout, "created %d\n", sandboxPid)

	// Reap everything; the sandbox's status is the container's. After the sandbox, the
	// others (gofer, stub processes) get a moment, then the shim exits anyway.
	type reaped struct {
		pid int
		ws  syscall.WaitStatus
	}
	reapedCh := make(chan reaped, 16)
	go func() {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil { // ECHILD: no child left
				close(reapedCh)
				return
			}
			reapedCh <- reaped{pid, ws}
		}
	}()
	var (
		status    Status
		gotStatus bool
		linger    <-chan time.Time
		deleting  bool
	)
	for {
		select {
		case r, ok := <-reapedCh:
			if !ok {
				reapedCh = nil
				if !gotStatus {
					// The sandbox was not our child (it cannot be) or was reaped elsewhere.
					status = Status{ExitCode: 137, Signal: int(syscall.SIGKILL)}
					gotStatus = true
				}
				break
			}
			if r.pid != sandboxPid {
				continue
			}
			gotStatus = true
			switch {
			case r.ws.Exited():
				status = Status{ExitCode: r.ws.ExitStatus()}
			case r.ws.Signaled():
				status = Status{ExitCode: 128 + int(r.ws.Signal()), Signal: int(r.ws.Signal())}
			}
			if n, ok := runsc.OOMKills(cgroup); ok && n > 0 {
				status.OOMKilled = true
			}
			logf("sandbox pid %d ended: exit code %d, signal %d, oom %v", sandboxPid, status.ExitCode, status.Signal, status.OOMKilled)
			linger = time.After(2 * time.Second)
		case <-linger:
			reapedCh = nil
		case s := <-term:
			if !deleting {
				deleting = true
				logf("%v: deleting the container", s)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					// Its own wait may find its child reaped by the loop above: ignore that.
					_ = eng.Destroy(ctx, *id, *bundle)
				}()
			}
		}
		if gotStatus && reapedCh == nil {
			break
		}
	}
	writeStatus(status)
	return 0
}

// setChildSubreaper makes the process a child subreaper (PR_SET_CHILD_SUBREAPER = 36).
func setChildSubreaper() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, 36, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// StatusPath is where a container's shim writes its status, beside its bundle.
func StatusPath(bundle string) string { return filepath.Join(bundle, "exit.json") }
