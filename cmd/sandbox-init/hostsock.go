package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// hostSocket is PID 1's listener on its host socket (proto.HostSocketEnv), which a pause closes
// and a restore opens again (proto/pause.go). The socket's folder is hidden from the box once
// PID 1 listens (hideDir), and PID 1 cannot mount any more afterwards, so it keeps a descriptor
// of the folder from before: the socket is bound again through /proc/self/fd/<dir>/<name>,
// and its file removed and the reopen marker read with *at calls on it. The descriptor is
// close-on-exec and PID 1 is not dumpable: no command of the box can use it.
type hostSocket struct {
	log  *slog.Logger
	srv  *server.Server
	key  []byte
	dir  int    // the socket's folder, opened before it was hidden
	name string // the socket's name in it

	mu sync.Mutex
	ln *net.UnixListener // nil while quiesced
	// accepting is closed when ln's accept loop has ended.
	accepting chan struct{}
	closed    bool
}

// listenHost opens the socket's folder and listens at path. The folder descriptor is kept
// even when the listen fails (a later reopen may succeed).
func listenHost(log *slog.Logger, srv *server.Server, key []byte, path string) (*hostSocket, error) {
	dir, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the host socket's folder: %w", err)
	}
	h := &hostSocket{log: log, srv: srv, key: key, dir: dir, name: filepath.Base(path)}
	_ = unix.Unlinkat(dir, h.name, 0) // stale, from an earlier run
	h.mu.Lock()
	defer h.mu.Unlock()
	return h, h.listenLocked(path)
}

// via is the path that reaches the socket's name through the kept folder descriptor.
func (h *hostSocket) via() string {
	return "/proc/self/fd/" + strconv.Itoa(h.dir) + "/" + h.name
}

func (h *hostSocket) listenLocked(path string) error {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	// The file is removed through the folder's descriptor (quiesce), never through path, which
	// the hidden folder's tmpfs covers.
	ln.SetUnlinkOnClose(false)
	_ = unix.Fchmodat(h.dir, h.name, 0o600, 0)
	h.ln = ln
	h.accepting = make(chan struct{})
	go func() {
		defer close(h.accepting)
		acceptLoop(h.log, ln, h.srv, h.key, true)
	}()
	return nil
}

// quiesce closes the listener and removes the socket's file. It reports whether the listener
// was open.
func (h *hostSocket) quiesce() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ln == nil {
		return false, nil
	}
	err := h.ln.Close()
	<-h.accepting
	h.ln = nil
	if uerr := unix.Unlinkat(h.dir, h.name, 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("removing the host socket: %w", uerr))
	}
	h.log.Info("host socket closed for a pause")
	go h.watchMarker()
	return true, err
}

// markerPoll is how often a quiesced init looks for the reopen marker. It runs only while the
// box is quiesced: the moments before its checkpoint, and after its restore until the marker
// is there (the runtime writes it before `runsc restore`, so that a restored box listens within
// a poll, with no signal to send).
const markerPoll = 2 * time.Millisecond

// watchMarker polls for the reopen marker until the socket is open again or closed for good.
func (h *hostSocket) watchMarker() {
	for {
		time.Sleep(markerPoll)
		h.mu.Lock()
		if h.ln != nil || h.closed {
			h.mu.Unlock()
			return
		}
		var st unix.Stat_t
		err := unix.Fstatat(h.dir, proto.ReopenMarker, &st, unix.AT_SYMLINK_NOFOLLOW)
		h.mu.Unlock()
		if err == nil {
			h.reopen()
			return
		}
	}
}

// reopen listens on the host socket again when the runtime asked for it (the reopen marker is
// in the folder), and deletes the marker. Without the marker, or with the socket open, it does
// nothing.
func (h *hostSocket) reopen() {
	h.mu.Lock()
	defer h.mu.Unlock()
	fd, err := unix.Openat(h.dir, proto.ReopenMarker, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		h.log.Warn("asked to reopen the host socket without the runtime's marker; ignored", "err", err)
		return
	}
	unix.Close(fd)
	defer func() { _ = unix.Unlinkat(h.dir, proto.ReopenMarker, 0) }()
	if h.ln != nil || h.closed {
		return
	}
	_ = unix.Unlinkat(h.dir, h.name, 0)
	if err := h.listenLocked(h.via()); err != nil {
		// Attaches fall back to `init connect` until the next reopen.
		h.log.Error("listening on the host socket again", "err", err)
		return
	}
	h.log.Info("host socket open again after a restore")
	// A restored box's first clone pays again what PID 1's start paid once (Server.Warm: the
	// seccomp filter's state of a task, which a restore does not bring back): pay it in the
	// background instead of in the first exec after the resume, once the resume's own attach
	// is likely done (warmAfterRestore): a warm-up beside that attach made the resume's answer
	// 7-30 ms later here. An exec that comes sooner pays it itself, as before.
	time.AfterFunc(warmAfterRestore, func() {
		start := time.Now()
		if err := h.srv.Warm(); err != nil {
			h.log.Warn("warming up exec starts after a restore", "err", err)
			return
		}
		h.log.Info("exec starts warmed up after a restore", "ms", float64(time.Since(start).Microseconds())/1000)
	})
}

// warmAfterRestore is how long after listening again a restored init waits before it warms up
// its exec starts.
const warmAfterRestore = 250 * time.Millisecond

// close ends the listener for good (PID 1 is stopping).
func (h *hostSocket) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.ln != nil {
		_ = h.ln.Close()
		<-h.accepting
		h.ln = nil
	}
	_ = unix.Close(h.dir)
}
