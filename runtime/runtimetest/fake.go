package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
	"sandboxd/runtime"
)

// Fake is an in-memory runtime.Driver for unit tests of the domain. Records live in a map;
// a box's workspace is a folder under the Fake's dir; Attach serves a real server.Server
// in-process over net.Pipe, so commands really run, on the host, with the workspace as their
// working directory (there is no isolation: absolute paths are the host's). Writes honour
// fences (runtime.WithFence) as a real driver's do. Kill injects a crash, FailNext an error.
// It passes Run with SkipHostIsolation.
type Fake struct {
	dir string

	mu     sync.Mutex
	boxes  map[string]*fakeBox
	fail   map[string]error
	starts int
	closed bool
	// imageGate, while set, holds the images MemoryImage returns (GateMemoryImages).
	imageGate *ImageGate
	// getsHeld, while set, holds every Get until it is closed (HoldGets).
	getsHeld chan struct{}
}

type fakeBox struct {
	rec    runtime.Record
	phase  runtime.Phase
	reason string
	lost   bool
	srv    *server.Server // while running
	key    []byte         // the channel key of the running server
	fence  uint64         // the highest fence a write carried (runtime.WithFence)
	// conns are the guest ends of the box's attaches: a pause breaks them, as runsc's save
	// does.
	conns map[net.Conn]struct{}
	// paused is the guest server a Pause kept (its commands run on: the fake does not freeze
	// them) until a Resume with the image of that pause brings it back; image is that image
	// while the Fake keeps it (pause.go).
	paused   *server.Server
	pauseGen int
	image    []byte
	// stuck, while not nil, holds every read and write of the guest's ends of the box's
	// attaches until Unstick closes it: a box whose PID 1 was stopped (Stick).
	stuck chan struct{}
}

var _ runtime.Driver = (*Fake)(nil)

// NewFake returns a Fake keeping its boxes' workspaces and guest state under dir.
func NewFake(dir string) *Fake {
	return &Fake{dir: dir, boxes: make(map[string]*fakeBox), fail: make(map[string]error)}
}

// NewFakeT returns a Fake in a temporary folder that is closed when the test ends.
func NewFakeT(t testing.TB) *Fake {
	f := NewFake(t.TempDir())
	t.Cleanup(f.Close)
	return f
}

// Close stops every box's guest server (killing what runs in it).
func (f *Fake) Close() {
	f.mu.Lock()
	f.closed = true
	var srvs []*server.Server
	for _, b := range f.boxes {
		if b.srv != nil {
			srvs = append(srvs, b.srv)
			b.srv = nil
			b.phase = runtime.PhaseStopped
		}
		if b.paused != nil {
			srvs = append(srvs, b.paused)
			b.paused = nil
		}
	}
	f.mu.Unlock()
	for _, s := range srvs {
		s.Close()
	}
}

// Workspace is the host folder of a box's workspace (it may be removed to simulate a lost
// volume: the next Start reports fresh).
func (f *Fake) Workspace(id string) string { return filepath.Join(f.dir, "boxes", id, "workspace") }

// Kill makes a running box fail as a crashed one would: its processes die, its attaches
// break, and Get reports PhaseFailed with reason.
func (f *Fake) Kill(id, reason string) error { return f.takeDown(id, reason, false) }

// Lose takes a running box's compute away as a deleted pod would: like Kill, with Box.Lost.
func (f *Fake) Lose(id, reason string) error { return f.takeDown(id, reason, true) }

func (f *Fake) takeDown(id, reason string, lost bool) error {
	f.mu.Lock()
	b, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	srv := b.srv
	b.srv, b.phase, b.reason, b.lost = nil, runtime.PhaseFailed, reason, lost
	f.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	return nil
}

// HoldGets holds every Get (as a runtime whose reads are slow) until the returned function
// is called.
func (f *Fake) HoldGets() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := make(chan struct{})
	f.getsHeld = held
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			if f.getsHeld == held {
				f.getsHeld = nil
			}
			f.mu.Unlock()
			close(held)
		})
	}
}

// FailNext makes the next call of the named method ("Create", "Start", "Stop", "Delete",
// "Get", "List", "UpdateRecord", "Attach", "Check", "Pause", "Resume") return err.
func (f *Fake) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = err
}

// injected returns and clears the error queued for method. Called with f.mu held.
func (f *Fake) injected(method string) error {
	err := f.fail[method]
	delete(f.fail, method)
	return err
}

// Name implements runtime.Driver.
func (f *Fake) Name() string { return "fake" }

// Create implements runtime.Driver.
func (f *Fake) Create(ctx context.Context, rec runtime.Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Create"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if rec.ID == "" || filepath.Base(rec.ID) != rec.ID || rec.ID == "." || rec.ID == ".." {
		return fmt.Errorf("fake: invalid box id %q", rec.ID)
	}
	if _, ok := f.boxes[rec.ID]; ok {
		return fmt.Errorf("fake: box %s: %w", rec.ID, runtime.ErrExists)
	}
	ws := f.Workspace(rec.ID)
	_ = os.RemoveAll(filepath.Dir(ws))
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	fence, _ := runtime.FenceFrom(ctx)
	b := &fakeBox{rec: cloneRecord(rec), fence: fence}
	if err := f.startLocked(b); err != nil {
		_ = os.RemoveAll(filepath.Dir(ws))
		return err
	}
	f.boxes[rec.ID] = b
	return nil
}

// startLocked starts a box's guest server with a fresh state folder (the real one is a tmpfs
// that a stop loses). Called with f.mu held.
func (f *Fake) startLocked(b *fakeBox) error {
	if f.closed {
		return errors.New("fake: closed")
	}
	f.starts++
	srv, err := server.New(server.Options{
		Workspace: f.Workspace(b.rec.ID),
		StateDir:  filepath.Join(f.dir, "boxes", b.rec.ID, "execs-"+strconv.Itoa(f.starts)),
		Reap:      false,
		BaseEnv:   baseEnv(b.rec.Spec.Env),
	})
	if err != nil {
		return fmt.Errorf("fake: guest server: %w", err)
	}
	b.srv, b.key, b.phase, b.reason, b.lost = srv, proto.NewChannelKey(), runtime.PhaseRunning, "", false
	return nil
}

// Start implements runtime.Driver.
func (f *Fake) Start(ctx context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Start"); err != nil {
		return false, err
	}
	b, ok := f.boxes[id]
	if !ok {
		return false, fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	if err := b.admit(ctx); err != nil {
		return false, err
	}
	if b.phase == runtime.PhaseRunning {
		return false, nil
	}
	if b.paused != nil {
		// A start discards the memory a pause kept.
		go b.paused.Close()
		b.paused, b.image = nil, nil
	}
	fresh := false
	if _, err := os.Stat(f.Workspace(id)); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(f.Workspace(id), 0o755); err != nil {
			return false, err
		}
		fresh = true
	}
	return fresh, f.startLocked(b)
}

// Stop implements runtime.Driver.
func (f *Fake) Stop(ctx context.Context, id string) error {
	f.mu.Lock()
	if err := f.injected("Stop"); err != nil {
		f.mu.Unlock()
		return err
	}
	b, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	if err := b.admit(ctx); err != nil {
		f.mu.Unlock()
		return err
	}
	srv := b.srv
	b.srv, b.phase, b.reason, b.lost = nil, runtime.PhaseStopped, "", false
	f.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	return nil
}

// Delete implements runtime.Driver.
func (f *Fake) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	if err := f.injected("Delete"); err != nil {
		f.mu.Unlock()
		return err
	}
	b, ok := f.boxes[id]
	if !ok {
		f.mu.Unlock()
		return nil
	}
	if err := b.admit(ctx); err != nil {
		f.mu.Unlock()
		return err
	}
	delete(f.boxes, id)
	f.mu.Unlock()
	if b.srv != nil {
		b.srv.Close()
	}
	if b.paused != nil {
		b.paused.Close()
	}
	return os.RemoveAll(filepath.Join(f.dir, "boxes", id))
}

// Get implements runtime.Driver.
func (f *Fake) Get(ctx context.Context, id string) (runtime.Box, error) {
	f.mu.Lock()
	held := f.getsHeld
	f.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return runtime.Box{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Get"); err != nil {
		return runtime.Box{}, err
	}
	b, ok := f.boxes[id]
	if !ok || b.rec.Pool != "" {
		return runtime.Box{}, fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	return b.box(), nil
}

// List implements runtime.Driver, in id order.
func (f *Fake) List(ctx context.Context) ([]runtime.Box, error) {
	return f.listBoxes("List", false)
}

// listBoxes lists the boxes in a warm pool (pooled) or the others, in id order, failing as op.
func (f *Fake) listBoxes(op string, pooled bool) ([]runtime.Box, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected(op); err != nil {
		return nil, err
	}
	boxes := make([]runtime.Box, 0, len(f.boxes))
	for _, id := range slices.Sorted(maps.Keys(f.boxes)) {
		if b := f.boxes[id]; (b.rec.Pool != "") == pooled {
			boxes = append(boxes, b.box())
		}
	}
	return boxes, nil
}

// UpdateRecord implements runtime.Driver. fn runs under the Fake's lock: it must not call
// the Fake.
func (f *Fake) UpdateRecord(ctx context.Context, id string, fn func(*runtime.Record) error) (runtime.Record, error) {
	return f.updateBox(ctx, "UpdateRecord", id, false, fn)
}

// updateBox is UpdateRecord (pooled false: boxes of warm pools are not found) and UpdatePool
// (pooled true: only they are), failing as op.
func (f *Fake) updateBox(ctx context.Context, op, id string, pooled bool, fn func(*runtime.Record) error) (runtime.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected(op); err != nil {
		return runtime.Record{}, err
	}
	b, ok := f.boxes[id]
	if !ok || (b.rec.Pool != "") != pooled {
		if pooled {
			return runtime.Record{}, fmt.Errorf("fake: box %s is not in a warm pool: %w", id, runtime.ErrNotFound)
		}
		return runtime.Record{}, fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	fence, _, err := runtime.AdmitFence(ctx, b.fence)
	if err != nil {
		return runtime.Record{}, fmt.Errorf("fake: box %s: %w", id, err)
	}
	rec := cloneRecord(b.rec)
	if err := fn(&rec); err != nil {
		return runtime.Record{}, err
	}
	if rec.ID != id {
		return runtime.Record{}, fmt.Errorf("fake: %s may not change the id (%s to %s)", op, id, rec.ID)
	}
	b.rec, b.fence = cloneRecord(rec), fence
	return rec, nil
}

// box is b as the runtime reports it. Called with f.mu held.
func (b *fakeBox) box() runtime.Box {
	return runtime.Box{Record: cloneRecord(b.rec), Phase: b.phase, Reason: b.reason, Lost: b.lost, Fence: b.fence}
}

// admit checks a lifecycle write made with ctx against the box's fence and records a higher
// one. Called with f.mu held.
func (b *fakeBox) admit(ctx context.Context) error {
	fence, _, err := runtime.AdmitFence(ctx, b.fence)
	if err != nil {
		return fmt.Errorf("fake: box %s: %w", b.rec.ID, err)
	}
	b.fence = fence
	return nil
}

// Attach implements runtime.Driver: one end of a net.Pipe whose other end the box's guest
// server serves until either side closes.
func (f *Fake) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injected("Attach"); err != nil {
		return nil, err
	}
	b, ok := f.boxes[id]
	if !ok {
		return nil, fmt.Errorf("fake: box %s: %w", id, runtime.ErrNotFound)
	}
	if b.phase != runtime.PhaseRunning {
		return nil, fmt.Errorf("fake: box %s is %s: %w", id, b.phase, runtime.ErrNotRunning)
	}
	// The guest init's side of the channel, as cmd/sandbox-init serves it: the ready byte
	// (what `connect` writes), the handshake with the box's key, then the protocol.
	hostEnd, initEnd := net.Pipe()
	srv, key := b.srv, b.key
	if b.conns == nil {
		b.conns = map[net.Conn]struct{}{}
	}
	guestEnd := &stickyConn{Conn: initEnd, f: f, b: b, closed: make(chan struct{})}
	b.conns[guestEnd] = struct{}{}
	go func() {
		defer func() {
			f.mu.Lock()
			delete(b.conns, guestEnd)
			f.mu.Unlock()
		}()
		_ = initEnd.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := initEnd.Write([]byte{proto.ConnectReady}); err != nil {
			_ = initEnd.Close()
			return
		}
		if err := server.InitHandshake(initEnd, key); err != nil {
			_ = initEnd.Close()
			return
		}
		_ = initEnd.SetDeadline(time.Time{})
		srv.ServeConn(guestEnd) // ends when the pipe closes or the server is closed
	}()
	_ = hostEnd.SetDeadline(time.Now().Add(10 * time.Second))
	if err := client.AwaitReady(hostEnd); err != nil {
		_ = hostEnd.Close()
		return nil, fmt.Errorf("fake: attach %s: %w", id, err)
	}
	if err := client.HostHandshake(hostEnd, key); err != nil {
		_ = hostEnd.Close()
		return nil, fmt.Errorf("fake: attach %s: %w", id, err)
	}
	_ = hostEnd.SetDeadline(time.Time{})
	return hostEnd, nil
}

// Stick makes box id's guest stop answering on its attaches, as a box whose PID 1 was stopped
// (SIGSTOP) does: what it reads and writes waits until Unstick. Attaches still connect.
func (f *Fake) Stick(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.boxes[id]; ok && b.stuck == nil {
		b.stuck = make(chan struct{})
	}
}

// Unstick lets box id's guest go on (SIGCONT).
func (f *Fake) Unstick(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.boxes[id]; ok && b.stuck != nil {
		close(b.stuck)
		b.stuck = nil
	}
}

// stickyConn is the guest's end of an attach, held while its box is stuck.
type stickyConn struct {
	net.Conn
	f      *Fake
	b      *fakeBox
	closed chan struct{}
	once   sync.Once
}

// wait returns once the box is not stuck, or the conn was closed.
func (c *stickyConn) wait() error {
	c.f.mu.Lock()
	stuck := c.b.stuck
	c.f.mu.Unlock()
	if stuck == nil {
		return nil
	}
	select {
	case <-stuck:
		return nil
	case <-c.closed:
		return net.ErrClosed
	}
}

func (c *stickyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if werr := c.wait(); werr != nil {
		return 0, werr
	}
	return n, err
}

func (c *stickyConn) Write(p []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *stickyConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// Check implements runtime.Driver.
func (f *Fake) Check(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected("Check")
}

// baseEnv is a box's guest environment: the init's defaults with the spec's Env over them, as
// the local driver gives PID 1.
func baseEnv(env map[string]string) []string {
	out := server.DefaultBaseEnv()
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

func cloneRecord(r runtime.Record) runtime.Record {
	r.Annotations = maps.Clone(r.Annotations)
	r.Labels = maps.Clone(r.Labels)
	r.Spec.Env = maps.Clone(r.Spec.Env)
	return r
}
