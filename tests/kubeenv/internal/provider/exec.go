package provider

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	utilexec "k8s.io/utils/exec"

	"sandboxd/tests/kubeenv/internal/engine"
)

// Exec stream tuning.
const (
	// copyBufSize is the buffer of each stream copy: a read returns what is there, and it is
	// written on at once (no batching), so small messages, like the HTTP/2 frames the
	// project's driver sends through `sandbox-init connect`, are not delayed.
	copyBufSize = 32 << 10
	// outputDrain is how long the output streams may stay idle after the command exited
	// before the exec ends without their EOF (a background process of the command may hold
	// them open). Idle, not in all: see outputPump.drain.
	outputDrain = 2 * time.Second
	// execKillWait is how long a cancelled exec's host process gets after its command was
	// killed inside the sandbox.
	execKillWait = 3 * time.Second
)

// exec runs cmd in the container with `runsc exec` or `runc exec` (the pod's engine),
// copying the streams both ways as data arrives. The child's stdin is closed when the
// client's stdin ends. When ctx ends (the client went away), the command itself is killed
// (killing only the host `runsc exec` would leave it running in the sandbox).
func (pr *podRuntime) exec(ctx context.Context, name string, cmd []string, attach api.AttachIO) error {
	if len(cmd) == 0 {
		return errdefs.InvalidInput("exec: no command")
	}
	pr.mu.Lock()
	c, err := pr.container(name)
	running := err == nil && c.started && c.state.Running != nil && !pr.deleting
	eng := pr.eng
	pr.mu.Unlock()
	if err != nil {
		return errdefs.AsNotFound(err)
	}
	if !running {
		return fmt.Errorf("exec in %s/%s: %w", pr.key, c.spec.Name, errNotRunning)
	}
	if attach.TTY() {
		// No terminal support: the command runs with plain pipes; drain resize events.
		go func() {
			for {
				select {
				case <-attach.Resize():
				case <-ctx.Done():
					return
				}
			}
		}()
	}

	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	pidFile := filepath.Join(pr.dir, "exec-"+hex.EncodeToString(rnd[:])+".pid")
	defer os.Remove(pidFile)
	proc := eng.Exec(pidFile, c.id, cmd)

	// *os.File stdio, so exec.Cmd starts no copying goroutines of its own that Wait would
	// wait for (the sandbox may hold the far ends open after the host process is gone).
	var closeAfterStart, closeAtEnd []*os.File
	defer func() {
		for _, f := range closeAfterStart {
			f.Close()
		}
		for _, f := range closeAtEnd {
			f.Close()
		}
	}()
	pipe := func() (*os.File, *os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("exec: pipe: %w", err)
		}
		return r, w, nil
	}
	var stdinW, stdoutR, stderrR *os.File
	if attach.Stdin() != nil {
		r, w, err := pipe()
		if err != nil {
			return err
		}
		proc.Stdin, stdinW = r, w
		closeAfterStart, closeAtEnd = append(closeAfterStart, r), append(closeAtEnd, w)
	}
	if attach.Stdout() != nil {
		r, w, err := pipe()
		if err != nil {
			return err
		}
		proc.Stdout, stdoutR = w, r
		closeAfterStart, closeAtEnd = append(closeAfterStart, w), append(closeAtEnd, r)
	}
	var stderrBuf bytes.Buffer
	if attach.Stderr() != nil {
		r, w, err := pipe()
		if err != nil {
			return err
		}
		proc.Stderr, stderrR = w, r
		closeAfterStart, closeAtEnd = append(closeAfterStart, w), append(closeAtEnd, r)
	} else {
		proc.Stderr = &limitedWriter{buf: &stderrBuf, max: 4 << 10}
	}
	if err := proc.Start(); err != nil {
		return fmt.Errorf("exec in %s/%s: %w", pr.key, c.spec.Name, err)
	}
	for _, f := range closeAfterStart {
		f.Close()
	}
	closeAfterStart = nil

	if stdinW != nil {
		go func() {
			_ = copyStream(stdinW, attach.Stdin())
			stdinW.Close() // the client's stdin ended: the command sees EOF
		}()
	}
	var pump outputPump
	for _, s := range []struct {
		r *os.File
		w io.Writer
	}{{stdoutR, attach.Stdout()}, {stderrR, attach.Stderr()}} {
		if s.r != nil {
			pump.start(s.w, s.r)
		}
	}

	waited := make(chan error, 1)
	go func() { waited <- proc.Wait() }()
	var waitErr error
	select {
	case waitErr = <-waited:
	case <-ctx.Done():
		pr.killExec(eng, pidFile, c.id)
		select {
		case waitErr = <-waited:
		case <-time.After(execKillWait):
			_ = proc.Process.Kill()
			waitErr = <-waited
		}
	}
	// Let the output drain: it ends at EOF once the command and the sandbox's copies of
	// its stdio are closed.
	pump.drain(ctx, outputDrain)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		code := ee.ExitCode()
		if code < 0 {
			code = 128 + 9
		}
		msg := fmt.Sprintf("command terminated with exit code %d", code)
		if s := strings.TrimSpace(stderrBuf.String()); s != "" {
			msg += ": " + s
		}
		return utilexec.CodeExitError{Err: errors.New(msg), Code: code}
	}
	if waitErr != nil {
		return fmt.Errorf("exec in %s/%s: %w", pr.key, c.spec.Name, waitErr)
	}
	return nil
}

// killExec kills an exec'd command (its pid is in pidFile).
func (pr *podRuntime) killExec(eng engine.Engine, pidFile, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), execKillWait)
	defer cancel()
	if err := eng.KillExec(ctx, pidFile, id); err != nil {
		pr.p.log.Debug("kill exec", "pod", pr.key, "err", err)
	}
}

// outputPump copies a command's output pipes to the client's streams.
type outputPump struct {
	ended chan struct{} // a receive per copy at its end
	n     int

	mu      sync.Mutex
	last    time.Time // the last write's end, or the drain's start
	writing int       // writes under way
}

// start copies src to dst until src's EOF.
func (p *outputPump) start(dst io.Writer, src io.Reader) {
	if p.ended == nil {
		p.ended = make(chan struct{}, 2)
	}
	p.n++
	go func() {
		_ = copyStream(&pumpWriter{w: dst, p: p}, src)
		p.ended <- struct{}{}
	}()
}

// drain waits, once the command exited, until every copy ended, or until none has moved
// data for idle (a background process of the command may hold an output open without writing).
// A write blocked on a slow client is not idleness: output still on its way (in the pipe and
// the streams' windows) is copied to its end, as a kubelet does, however long that takes.
// A client gone (ctx ended) is waited for no more.
func (p *outputPump) drain(ctx context.Context, idle time.Duration) {
	p.mark(0)
	t := time.NewTimer(idle)
	defer t.Stop()
	for left := p.n; left > 0; {
		select {
		case <-p.ended:
			left--
		case <-ctx.Done():
			return
		case <-t.C:
			quiet := p.quiet()
			if quiet >= idle {
				return
			}
			t.Reset(idle - quiet)
		}
	}
}

func (p *outputPump) mark(writing int) {
	p.mu.Lock()
	p.last = time.Now()
	p.writing += writing
	p.mu.Unlock()
}

// quiet is how long no copy has written; 0 while one writes.
func (p *outputPump) quiet() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writing > 0 {
		return 0
	}
	return time.Since(p.last)
}

// pumpWriter is a copy's destination, marking its writes in the pump.
type pumpWriter struct {
	w io.Writer
	p *outputPump
}

func (m *pumpWriter) Write(b []byte) (int, error) {
	m.p.mark(1)
	defer m.p.mark(-1)
	return m.w.Write(b)
}

func (m *pumpWriter) Flush() error {
	if f, ok := m.w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}

// copyStream copies src to dst, writing every read at once.
func copyStream(dst io.Writer, src io.Reader) error {
	buf := make([]byte, copyBufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			if f, ok := dst.(interface{ Flush() error }); ok {
				_ = f.Flush()
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// limitedWriter keeps the first max bytes written to it.
type limitedWriter struct {
	buf *bytes.Buffer
	max int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if room := w.max - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// logPoll is how often a followed log is checked for new output.
const logPoll = 200 * time.Millisecond

// logs returns a container's log (tail lines, limit bytes, follow while it runs).
// Timestamps and since* are not supported: the file has no timestamps.
func (pr *podRuntime) logs(ctx context.Context, name string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pr.mu.Lock()
	c, err := pr.container(name)
	pr.mu.Unlock()
	if err != nil {
		return nil, errdefs.AsNotFound(err)
	}
	if opts.Previous {
		return nil, errdefs.InvalidInputf("container %s has no previous run (containers are never restarted here)", c.spec.Name)
	}
	f, err := os.Open(c.logPath)
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, fmt.Errorf("logs of %s/%s: %w", pr.key, c.spec.Name, err)
	}
	start := int64(0)
	if opts.Tail > 0 {
		start = tailOffset(f, opts.Tail)
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	var r io.Reader = f
	if !opts.Follow {
		if opts.LimitBytes > 0 {
			r = io.LimitReader(f, int64(opts.LimitBytes))
		}
		return struct {
			io.Reader
			io.Closer
		}{r, f}, nil
	}
	pr.mu.Lock()
	exited := c.exited
	pr.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	prd, pwr := io.Pipe()
	go func() {
		defer f.Close()
		var w io.Writer = pwr
		if opts.LimitBytes > 0 {
			w = &capWriter{w: pwr, left: int64(opts.LimitBytes)}
		}
		buf := make([]byte, copyBufSize)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					pwr.CloseWithError(werr)
					return
				}
				continue
			}
			if err != nil && !errors.Is(err, io.EOF) {
				pwr.CloseWithError(err)
				return
			}
			select {
			case <-exited:
				// Read what was written before the exit, then end.
				if n, _ := f.Read(buf); n > 0 {
					_, _ = w.Write(buf[:n])
					continue
				}
				pwr.Close()
				return
			case <-ctx.Done():
				pwr.CloseWithError(ctx.Err())
				return
			case <-time.After(logPoll):
			}
		}
	}()
	return struct {
		io.Reader
		io.Closer
	}{prd, closerFunc(func() error { cancel(); return prd.Close() })}, nil
}

// tailOffset returns the offset where the last n lines of f start.
func tailOffset(f *os.File, n int) int64 {
	st, err := f.Stat()
	if err != nil {
		return 0
	}
	size := st.Size()
	const chunk = 32 << 10
	lines := 0
	end := size
	// A final newline does not start a line.
	if size > 0 {
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, size-1); err == nil && b[0] == '\n' {
			end = size - 1
		}
	}
	buf := make([]byte, chunk)
	for pos := end; pos > 0; {
		k := min(int64(chunk), pos)
		pos -= k
		if _, err := f.ReadAt(buf[:k], pos); err != nil && !errors.Is(err, io.EOF) {
			return 0
		}
		for i := k - 1; i >= 0; i-- {
			if buf[i] == '\n' {
				lines++
				if lines == n {
					return pos + i + 1
				}
			}
		}
	}
	return 0
}

// capWriter writes at most left bytes, then fails.
type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.w.Write(p)
	c.left -= int64(n)
	return n, err
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
