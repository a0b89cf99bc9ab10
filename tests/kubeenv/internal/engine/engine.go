// Package engine is the node's seam over its container runtimes, one per RuntimeClass
// handler: runsc (gVisor: pods of a runsc RuntimeClass and pods without one, as before) and
// runc (native: pods of a runc RuntimeClass). The provider and each container's shim drive
// containers only through an Engine; the runtimes' command lines stay in packages runsc and
// runc.
package engine

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"sandboxd/tests/kubeenv/internal/runc"
	"sandboxd/tests/kubeenv/internal/runsc"
)

// RuntimeClass handlers the node runs.
const (
	Runsc = "runsc"
	Runc  = "runc"
)

// Engine runs the containers of one runtime handler. Container ids are the node's fixed
// length ids (runsc matches ids by prefix).
type Engine interface {
	// Handler is the RuntimeClass handler served ("runsc", "runc"); it also prefixes the
	// container ids of pod statuses ("runc://…").
	Handler() string
	// Root is the runtime's state folder.
	Root() string
	// Prepare completes container id's spec for the runtime and readies its bundle folder
	// (runc: the overlay root). Destroy undoes it, also after a failed Prepare.
	Prepare(spec *runsc.Spec, bundle, id string) error
	// Create creates the container, with its stdio (and the runtime's output) on log. It
	// returns the pid whose exit status is the container's (runsc: the sandbox; runc: the
	// container's init), a child of the caller (a child subreaper) once Create returned, and
	// the container's cgroup.
	Create(ctx context.Context, log *os.File, bundle, id string) (pid int, cgroup string, err error)
	// Start starts a created container (the runtime's output on log).
	Start(ctx context.Context, log *os.File, id string) error
	// Signal sends a signal (TERM, KILL, …) to the container's init.
	Signal(ctx context.Context, id, sig string) error
	// Alive reports whether the container's process still runs, from the runtime's state:
	// the fallback when the container's shim left no exit status.
	Alive(id string) bool
	// Exec returns the command that runs cmd in the container and writes the pid to kill it
	// by to pidFile (KillExec). Its stdio are the command's.
	Exec(pidFile, id string, cmd []string) *exec.Cmd
	// KillExec kills the command of an Exec whose pid is in pidFile.
	KillExec(ctx context.Context, pidFile, id string) error
	// Destroy kills and deletes the container and what Prepare made (bundle is its bundle
	// folder). Idempotent; a no-op without a container.
	Destroy(ctx context.Context, id, bundle string) error
	// DestroyAll destroys every container of the engine's root; it returns their ids.
	DestroyAll(ctx context.Context) ([]string, error)
	// ShimArgs are the command line flags that make the same engine in a shim (Flags).
	ShimArgs() []string
}

// NewRunsc returns the runsc engine over cli.
func NewRunsc(cli *runsc.CLI) Engine { return &runscEngine{cli} }

// NewRunc returns the runc engine over cli.
func NewRunc(cli *runc.CLI) Engine { return &runcEngine{cli} }

// Flags parse the ShimArgs of an engine in a shim process.
type Flags struct {
	handler, path, root, cgroupParent string
	flags                             multiFlag
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.handler, "handler", Runsc, "runtime handler: runsc or runc")
	fs.StringVar(&f.path, "runtime", "", "the runtime's binary")
	fs.StringVar(&f.root, "root", "", "the runtime's --root")
	fs.Var(&f.flags, "runtime-flag", "runsc global flag (repeatable)")
	fs.StringVar(&f.cgroupParent, "cgroup-parent", "", "runc: the node's cgroup parent")
}

// Engine returns the engine the parsed flags describe.
func (f *Flags) Engine() (Engine, error) {
	if f.path == "" || f.root == "" {
		return nil, errors.New("--runtime and --root are required")
	}
	switch f.handler {
	case Runsc:
		return NewRunsc(&runsc.CLI{Path: f.path, Root: f.root, Flags: f.flags}), nil
	case Runc:
		if f.cgroupParent == "" {
			return nil, errors.New("--cgroup-parent is required with --handler=runc")
		}
		return NewRunc(&runc.CLI{Path: f.path, Root: f.root, CgroupParent: f.cgroupParent}), nil
	}
	return nil, fmt.Errorf("--handler %q: want runsc or runc", f.handler)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// readPid reads the pid an exec wrote.
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q", path, b)
	}
	return pid, nil
}

// runscEngine is gVisor: each container its own sandbox (the node's behaviour before runc).
type runscEngine struct{ cli *runsc.CLI }

func (e *runscEngine) Handler() string { return Runsc }
func (e *runscEngine) Root() string    { return e.cli.Root }

// Prepare leaves the spec as it is: the root is the image folder itself, which runsc's
// --overlay2=root:memory never writes.
func (e *runscEngine) Prepare(*runsc.Spec, string, string) error { return nil }

func (e *runscEngine) Create(ctx context.Context, log *os.File, bundle, id string) (int, string, error) {
	if err := e.cli.RunLogged(ctx, log, "create", "--bundle="+bundle, id); err != nil {
		return 0, "", err
	}
	st, exists, err := e.cli.ReadState(id)
	if err != nil || !exists || st.SandboxPid() <= 0 {
		return 0, "", fmt.Errorf("no sandbox pid in runsc's state (%v)", err)
	}
	return st.SandboxPid(), st.Cgroup("/" + id), nil
}

func (e *runscEngine) Start(ctx context.Context, log *os.File, id string) error {
	return e.cli.RunLogged(ctx, log, "start", id)
}

func (e *runscEngine) Signal(ctx context.Context, id, sig string) error {
	_, err := e.cli.Run(ctx, "kill", id, sig)
	return err
}

func (e *runscEngine) Alive(id string) bool { return e.cli.Alive(id) }

// Exec writes the command's pid inside the sandbox: only `runsc kill --pid` reaches it
// (killing the host `runsc exec` would leave it running).
func (e *runscEngine) Exec(pidFile, id string, cmd []string) *exec.Cmd {
	return e.cli.Command(append([]string{"exec", "--internal-pid-file=" + pidFile, id}, cmd...)...)
}

func (e *runscEngine) KillExec(ctx context.Context, pidFile, id string) error {
	pid, err := readPid(pidFile)
	if err != nil {
		return err
	}
	_, err = e.cli.Run(ctx, "kill", "--pid="+strconv.Itoa(pid), id, "KILL")
	return err
}

func (e *runscEngine) Destroy(ctx context.Context, id, _ string) error {
	return e.cli.Destroy(ctx, id, "/"+id)
}

func (e *runscEngine) DestroyAll(ctx context.Context) ([]string, error) {
	return e.cli.DestroyAll(ctx)
}

func (e *runscEngine) ShimArgs() []string {
	args := []string{"--handler=" + Runsc, "--runtime=" + e.cli.Path, "--root=" + e.cli.Root}
	for _, f := range e.cli.Flags {
		args = append(args, "--runtime-flag="+f)
	}
	return args
}

// runcEngine is the native runtime: containers share the host's kernel, in their own
// namespaces and cgroup.
type runcEngine struct{ cli *runc.CLI }

func (e *runcEngine) Handler() string { return Runc }
func (e *runcEngine) Root() string    { return e.cli.Root }

// Prepare adds runc's part of the spec and mounts the container's overlay root over the
// image folder (runc would write into the image folder itself).
func (e *runcEngine) Prepare(spec *runsc.Spec, bundle, id string) error {
	e.cli.Complete(spec, id)
	root, err := runc.MountRootfs(bundle, spec.Root.Path)
	if err != nil {
		return err
	}
	spec.Root.Path = root
	return nil
}

// Create runs `runc create`: it exits once the container's init waits for `runc start`;
// the init (its grandchild, made with CLONE_PARENT) is then reparented to the caller.
func (e *runcEngine) Create(ctx context.Context, log *os.File, bundle, id string) (int, string, error) {
	if err := e.cli.RunLogged(ctx, log, "create", "--bundle="+bundle, id); err != nil {
		return 0, "", err
	}
	st, exists, err := e.cli.ReadState(ctx, id)
	if err != nil || !exists || st.Pid <= 0 {
		return 0, "", fmt.Errorf("no init pid in runc's state (%v)", err)
	}
	return st.Pid, e.cli.Cgroup(id), nil
}

func (e *runcEngine) Start(ctx context.Context, log *os.File, id string) error {
	return e.cli.RunLogged(ctx, log, "start", id)
}

func (e *runcEngine) Signal(ctx context.Context, id, sig string) error {
	_, err := e.cli.Run(ctx, "kill", id, sig)
	return err
}

func (e *runcEngine) Alive(id string) bool { return e.cli.Alive(id) }

// Exec runs `runc exec`, which hands its stdio to the command (so large outputs go straight
// through the pipes) and exits with the command's status. The pid file holds the command's
// host pid.
func (e *runcEngine) Exec(pidFile, id string, cmd []string) *exec.Cmd {
	return e.cli.Command(append([]string{"exec", "--pid-file=" + pidFile, id}, cmd...)...)
}

// KillExec sends SIGKILL to the command's host pid: `runc exec` forwards the signals it gets,
// but not SIGKILL. The command is `runc exec`'s child until it is reaped, so its pid is not
// reused meanwhile.
func (e *runcEngine) KillExec(ctx context.Context, pidFile, id string) error {
	pid, err := readPid(pidFile)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill exec pid %d: %w", pid, err)
	}
	return nil
}

func (e *runcEngine) Destroy(ctx context.Context, id, bundle string) error {
	return e.cli.Destroy(ctx, id, bundle)
}

func (e *runcEngine) DestroyAll(ctx context.Context) ([]string, error) {
	return e.cli.DestroyAll(ctx)
}

func (e *runcEngine) ShimArgs() []string {
	return []string{"--handler=" + Runc, "--runtime=" + e.cli.Path, "--root=" + e.cli.Root, "--cgroup-parent=" + e.cli.CgroupParent}
}
