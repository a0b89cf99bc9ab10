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

	"golang.org/x/sys/unix"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
	"sandboxd/runtime"
)

// Attach implements runtime.Driver: a connection to the box's guest init through its host
// socket, or `runsc exec <id> /.sbx/init connect` with its stdin and stdout as the stream when
// there is none. Either way the stream is handed on only after the init proved the box's
// channel key (client.HostHandshake). A channel found tampered with — the socket's path not a
// socket, or a peer that is not the box's init — ends the box's compute and leaves it
// PhaseFailed with the reason; no other box is touched. ctx bounds only the set-up: the stream
// lives until Close.
func (d *Driver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return d.attachBox(ctx, id, true)
}

// AttachStream implements runtime.LocalAttacher: Attach through the box's host socket only.
// Without that socket it fails rather than start `runsc exec … connect`: an exec stream is held
// for as long as its command runs, and a process per stream would count against the box's
// pids limit.
func (d *Driver) AttachStream(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return d.attachBox(ctx, id, false)
}

// attachBox is Attach; without fallback it neither starts `runsc exec` nor takes the spare.
func (d *Driver) attachBox(ctx context.Context, id string, fallback bool) (io.ReadWriteCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if _, err := os.Stat(d.boxes.boxPath(id, recordFile)); err != nil {
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
	if _, err := os.Stat(d.boxes.boxPath(id, pausingFile)); err == nil {
		// No attach starts while the box is saved (a `runsc exec` in it would be saved too).
		return nil, fmt.Errorf("gvisor: box %s is being paused: %w", id, runtime.ErrNotRunning)
	}
	d.warmIdentity() // a box that runs may be paused: see warmIdentity
	if fallback {
		// The spare, which may be a `runsc exec` stream, is kept for the next Attach.
		if s := d.spares.Take(id); s != nil {
			return s, nil
		}
	}
	key, err := d.channelKey(id)
	if err != nil {
		return nil, err
	}
	c, err := d.dialHost(ctx, id, key)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, errTampered) {
		return nil, d.tampered(ctx, id, err)
	}
	if !fallback {
		return nil, fmt.Errorf("gvisor: box %s: its host socket does not answer: %w", id, err)
	}
	// No host socket (the init could not make it), or it does not answer: the fallback.
	s, err := d.attach(ctx, id, key)
	if errors.Is(err, errTampered) {
		return nil, d.tampered(ctx, id, err)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// errTampered marks an attach that found the box's channel tampered with: a socket path that
// is not a socket (a link planted to lead elsewhere), or a peer that failed the handshake.
var errTampered = errors.New("the control channel was tampered with")

// tampered records that the box's channel was tampered with, ends its compute (a box that
// impersonates its init or redirects its channel runs nothing more, and holds no slot once the
// domain sees it failed) and returns the error Attach answers with.
func (d *Driver) tampered(ctx context.Context, id string, cause error) error {
	if phase, why, err := d.observe(ctx, id); err == nil && phase != runtime.PhaseRunning {
		// The box died meanwhile (out of memory, say): that, not tampering, is the news.
		return fmt.Errorf("gvisor: box %s is %s (%s): %w", id, phase, why, runtime.ErrNotRunning)
	}
	reason := "the sandbox's control channel was tampered with, so its compute was stopped (" +
		strings.TrimPrefix(cause.Error(), "gvisor: ") + "); start it again to get a new one"
	d.log.Warn("box channel tampered with; stopping its compute", "box", id, "err", cause)
	unlock := d.boxMu.lock(id)
	defer unlock()
	if err := writeFileAtomic(d.boxes.boxPath(id, tamperedFile), []byte(reason), 0o600); err != nil {
		d.log.Error("recording a tampered channel", "box", id, "err", err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cliTimeout)
	defer cancel()
	if err := d.destroyContainer(cctx, id); err != nil {
		d.log.Error("stopping a box whose channel was tampered with", "box", id, "err", err)
	}
	return fmt.Errorf("gvisor: box %s: %s: %w", id, reason, runtime.ErrNotRunning)
}

// channelKey is the channel key of the box's current container.
func (d *Driver) channelKey(id string) ([]byte, error) {
	b, err := os.ReadFile(d.boxes.boxPath(id, channelKeyName))
	if err != nil {
		return nil, fmt.Errorf("gvisor: box %s has no channel key (started by an older sandboxd? start it again): %w", id, runtime.ErrNotRunning)
	}
	return proto.ParseChannelKey(string(b))
}

// hostSocket is the host path of the socket the box's guest init listens on (see
// proto.HostSocketEnv).
func (d *Driver) hostSocket(id string) string {
	return filepath.Join(d.boxes.boxPath(id, hostDn), hostSocketName)
}

const hostSocketName = "init.sock"

// startedAt is when the box's current container was set up (its host folder was made), zero
// for a box without one.
func (d *Driver) startedAt(id string) time.Time {
	fi, err := os.Stat(d.boxes.boxPath(id, hostDn))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// handshakeTimeout bounds an attach's ready byte and handshake when ctx has no earlier deadline.
const handshakeTimeout = 10 * time.Second

// dialHost attaches through the box's host socket: a plain connect, no `runsc exec`. It never
// follows a link: the folder is opened without following one (it is the driver's own, never
// mounted into the box whole), the socket's entry in it is opened as itself (O_PATH|O_NOFOLLOW)
// and must be a socket, and the connect goes to that very inode (/proc/self/fd/N). The stream
// starts with the ready byte and the handshake, which it consumes.
func (d *Driver) dialHost(ctx context.Context, id string, key []byte) (io.ReadWriteCloser, error) {
	dir, err := unix.Open(d.boxes.boxPath(id, hostDn), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("gvisor: the host socket folder of %s is not a folder: %w", id, errTampered)
		}
		return nil, &fs.PathError{Op: "open", Path: d.boxes.boxPath(id, hostDn), Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, hostSocketName, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.hostSocket(id), Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: d.hostSocket(id), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("gvisor: the host socket of %s is a %s, not a socket: %w", id, fileType(st.Mode), errTampered)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, err
	}
	if err := d.greet(ctx, c, c, key); err != nil {
		c.Close()
		return nil, fmt.Errorf("gvisor: attach %s through its host socket: %w", id, err)
	}
	return c, nil
}

// deadliner is a stream whose reads and writes can be cut by a deadline.
type deadliner interface {
	SetDeadline(t time.Time) error
}

// greet reads a new stream's ready byte and runs the host's side of the handshake, within ctx
// and handshakeTimeout. A peer that answers like something else than the box's init is
// errTampered.
func (d *Driver) greet(ctx context.Context, rw io.ReadWriter, dl deadliner, key []byte) error {
	deadline := time.Now().Add(handshakeTimeout)
	if t, ok := ctx.Deadline(); ok && t.Before(deadline) {
		deadline = t
	}
	_ = dl.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = dl.SetDeadline(time.Now()) })
	err := client.AwaitReady(rw)
	if err == nil {
		err = client.HostHandshake(rw, key)
		// The box's init answers a greeting at once; a peer that sent the ready byte and then
		// hangs up instead is not it (a dying box is told apart by the caller).
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: it closed the stream instead of proving the key", proto.ErrImpostor)
		}
	}
	stop()
	_ = dl.SetDeadline(time.Time{})
	if errors.Is(err, proto.ErrImpostor) {
		return fmt.Errorf("%w: %w", errTampered, err)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// fileType names the kind of file a mode says.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "folder"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	}
	return "special file"
}

// attach starts the attach process of a box without checking its phase: `runsc exec
// --process` of the init's `connect`, with no capability (connectProcess).
func (d *Driver) attach(ctx context.Context, id string, key []byte) (*attachStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	flags, err := d.containerFlags(id)
	if err != nil {
		return nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	pidFile := d.boxes.boxPath(id, "attach-"+hex.EncodeToString(rnd[:])+".pid")
	procFile := d.boxes.boxPath(id, connectProcessFile)
	if _, err := os.Stat(procFile); err != nil {
		if err := writeJSONAtomic(procFile, connectProcess()); err != nil {
			return nil, fmt.Errorf("gvisor: attach %s: %w", id, err)
		}
	}

	log, err := os.OpenFile(d.boxes.boxPath(id, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
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
	args := append(append([]string{}, flags...), "exec", "--process="+procFile, "--internal-pid-file="+pidFile, id)
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
	// 10 s while PID 1 is not listening yet); then the handshake.
	if err := d.greet(ctx, s, s, key); err != nil {
		s.Close()
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

// SetDeadline bounds the pipes' reads and writes (the handshake's).
func (s *attachStream) SetDeadline(t time.Time) error {
	_ = s.stdin.SetWriteDeadline(t)
	return s.stdout.SetReadDeadline(t)
}

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
			// The init listens within tens of ms of the start: poll finely for the first
			// 100 ms (a connect attempt costs microseconds), then every 5 ms.
			wait := 5 * time.Millisecond
			if attempt < 100 {
				wait = time.Millisecond
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("gvisor: box %s: guest init did not answer: %w (last error: %v; runsc.log: %s)", id, ctx.Err(), last, d.logTail(id, 400))
			case <-time.After(wait):
			}
		}
		last = d.probe(ctx, id)
		if last == nil {
			return nil
		}
	}
}

// probe makes one attach: its ready byte and handshake say the guest init is up. The attach
// is kept for the box's next Attach.
func (d *Driver) probe(ctx context.Context, id string) error {
	key, err := d.channelKey(id)
	if err != nil {
		return err
	}
	if c, err := d.dialHost(ctx, id, key); err == nil {
		d.spares.Keep(id, c)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
		return err
	}
	if time.Since(d.startedAt(id)) < hostSocketGrace {
		return errNotYet // the init is still coming up: try the host socket again shortly
	}
	s, err := d.attach(ctx, id, key)
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
		_, err := server.WriteTarReadahead(ctx, ws, pw)
		pw.CloseWithError(err)
	}()
	return pr, nil
}
