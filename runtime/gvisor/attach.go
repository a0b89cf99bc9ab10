package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandboxd/guest"
	"sandboxd/runtime"
)

// Attach implements runtime.Driver: `runsc exec <id> /.sbx/init connect` with its stdin and
// stdout as the stream. ctx bounds only the set-up: the stream lives until Close.
func (d *Driver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if _, err := os.Stat(d.boxPath(id, recordFile)); err != nil {
		return nil, fmt.Errorf("gvisor: box %s: %w", id, runtime.ErrNotFound)
	}
	phase, reason, err := d.observe(ctx, id)
	if err != nil {
		return nil, err
	}
	if phase != runtime.PhaseRunning {
		if reason != "" {
			return nil, fmt.Errorf("gvisor: box %s is %s (%s): %w", id, phase, reason, runtime.ErrNotRunning)
		}
		return nil, fmt.Errorf("gvisor: box %s is %s: %w", id, phase, runtime.ErrNotRunning)
	}
	if s := d.spares.Take(id); s != nil {
		return s, nil
	}
	if c, err := d.dialHost(ctx, id); err == nil {
		return c, nil
	}
	// No host socket (a box created before it existed, or the init could not make it).
	return d.attach(ctx, id)
}

// hostSocket is the host path of the socket the box's guest init listens on (see
// guest.HostSocketEnv).
func (d *Driver) hostSocket(id string) string {
	return filepath.Join(d.boxPath(id, hostDn), "init.sock")
}

// startedAt is when the box's current container was set up (its host folder was made), zero
// for a box without one.
func (d *Driver) startedAt(id string) time.Time {
	fi, err := os.Stat(d.boxPath(id, hostDn))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// dialHost attaches through the box's host socket: a plain connect, no `runsc exec`. The
// stream starts with the ready byte, which it consumes.
func (d *Driver) dialHost(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", d.hostSocket(id))
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	err = guest.AwaitReady(c)
	stop()
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("gvisor: attach %s through its host socket: %w", id, err)
	}
	return c, nil
}

// attach starts the attach process of a box without checking its phase.
func (d *Driver) attach(ctx context.Context, id string) (*attachStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	flags, err := d.containerFlags(id)
	if err != nil {
		return nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	pidFile := d.boxPath(id, "attach-"+hex.EncodeToString(rnd[:])+".pid")

	log, err := os.OpenFile(d.boxPath(id, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gvisor: open runsc log: %w", err)
	}
	defer log.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	args := append(append([]string{}, flags...), "exec", "--internal-pid-file="+pidFile, id, initPathInBox, "connect")
	// Not CommandContext: the stream outlives ctx.
	cmd := exec.Command(d.opts.Runsc, args...)
	// *os.File stdio: no copying goroutines that Wait would wait for (the sandbox may hold
	// the far ends open after the host process is gone). Its stderr goes to the box's log.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, log
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("gvisor: attach %s: %w", id, err)
	}
	s := &attachStream{d: d, id: id, flags: flags, pidFile: pidFile, cmd: cmd, stdin: inW, stdout: outR, done: make(chan struct{})}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()
	// The init's `connect` writes one ready byte once it reached PID 1 (it retries for up to
	// 10 s while PID 1 is not listening yet). Wait for it within ctx.
	if dl, ok := ctx.Deadline(); ok {
		_ = outR.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = outR.SetReadDeadline(time.Now()) })
	err = guest.AwaitReady(outR)
	stop()
	_ = outR.SetReadDeadline(time.Time{})
	if err != nil {
		s.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("gvisor: attach %s: %w", id, ctx.Err())
		}
		return nil, fmt.Errorf("gvisor: attach %s: %w", id, err)
	}
	return s, nil
}

// attachStream is one attach: the host `runsc exec … connect` process and its stdio pipes.
type attachStream struct {
	d       *Driver
	id      string
	flags   []string
	pidFile string
	cmd     *exec.Cmd
	stdin   *os.File
	stdout  *os.File
	done    chan struct{}
	waitErr error

	closeOnce sync.Once
	closeErr  error
}

func (s *attachStream) Read(p []byte) (int, error)  { return s.stdout.Read(p) }
func (s *attachStream) Write(p []byte) (int, error) { return s.stdin.Write(p) }

// How long Close waits for the attach process after each step.
const (
	attachGrace     = 2 * time.Second
	attachKillGrace = 3 * time.Second
)

// Close ends the attach: it closes both pipes (the guest's connect then ends by itself: EOF
// on its stdin, EPIPE on its stdout, so it never blocks writing to a reader that is gone),
// kills the in-sandbox process when it does not (killing only the host runsc exec would leave
// it running), kills the host process as a last resort, and waits for it: no zombie, no
// goroutine left. Reads and writes in flight fail.
func (s *attachStream) Close() error {
	s.closeOnce.Do(func() {
		s.stdin.Close()
		s.stdout.Close()
		if !s.waitFor(attachGrace) {
			if pid, err := s.innerPid(); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), attachKillGrace)
				_, err := s.d.runsc(ctx, s.flags, "kill", "--pid="+strconv.Itoa(pid), s.id, "KILL")
				cancel()
				if err != nil {
					s.d.log.Debug("kill attach process", "box", s.id, "err", err)
				}
			}
			if !s.waitFor(attachKillGrace) {
				_ = s.cmd.Process.Kill()
				<-s.done
			}
		}
		os.Remove(s.pidFile)
		var ee *exec.ExitError
		if s.waitErr != nil && !errors.As(s.waitErr, &ee) {
			s.closeErr = s.waitErr
		}
	})
	return s.closeErr
}

func (s *attachStream) waitFor(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.done:
		return true
	case <-t.C:
		return false
	}
}

func (s *attachStream) innerPid() (int, error) {
	b, err := os.ReadFile(s.pidFile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// waitReady attaches until the guest init answers with its ready byte, bounded by ctx
// and Options.ReadyTimeout. It gives up early when the box's sandbox dies.
func (d *Driver) waitReady(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.ReadyTimeout)
	defer cancel()
	var last error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			phase, reason, err := d.observe(ctx, id)
			if err == nil && phase != runtime.PhaseRunning {
				return fmt.Errorf("gvisor: box %s did not come up: %s: %s (last error: %v; runsc.log: %s)", id, phase, reason, last, d.logTail(id, 400))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("gvisor: box %s: guest init did not answer: %w (last error: %v; runsc.log: %s)", id, ctx.Err(), last, d.logTail(id, 400))
			case <-time.After(5 * time.Millisecond):
			}
		}
		last = d.probe(ctx, id)
		if last == nil {
			return nil
		}
	}
}

// probe makes one attach: its ready byte says the guest init is up. The attach is kept for
// the box's next Attach.
func (d *Driver) probe(ctx context.Context, id string) error {
	if c, err := d.dialHost(ctx, id); err == nil {
		d.spares.Keep(id, c)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
		return err
	}
	if time.Since(d.startedAt(id)) < hostSocketGrace {
		return errNotYet // the init is still coming up: try the host socket again shortly
	}
	s, err := d.attach(ctx, id)
	if err != nil {
		return err
	}
	d.spares.Keep(id, s)
	return nil
}

// hostSocketGrace is how long a new box's init gets to make its host socket before probes
// fall back to `runsc exec … connect`.
const hostSocketGrace = 2 * time.Second

var errNotYet = errors.New("gvisor: guest init not listening yet")

// ExportWorkspace implements runtime.WorkspaceExporter: the box's workspace folder on the host
// (on its disk, mounted for the read when it is not: see exportableWorkspace) as a tar stream,
// read without following any symlink the sandbox may have planted.
func (d *Driver) ExportWorkspace(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	ws, release, err := d.exportableWorkspace(id)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer release()
		_, err := guest.WriteTar(ctx, ws, pw)
		pw.CloseWithError(err)
	}()
	return pr, nil
}
