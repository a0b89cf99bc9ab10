// Package server is PID 1's side of the guest init's protocol (guest/proto): the server that
// runs as the init inside every sandbox (cmd/sandbox-init) and owns every process it starts
// (exec, the reaper, cgroups, exec logs, open stdin, terminals), serves the workspace's files and its tar export and
// staged import, and the init's end of the channel handshake. WriteTar, the export's
// never-follow-a-link walker, also serves the local driver, which reads a box's workspace
// folder on the host.
package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"sandboxd/guest/proto"
	"sandboxd/internal/version"
)

// Version is the guest init's version, reported by /v1/health and `sandbox-init version`:
// sandboxd's release version (internal/version), since both are built from one tree.
var Version = version.Version

// Options configures a guest init server. Zero values take the defaults.
type Options struct {
	// Workspace is the directory served by the file and tar endpoints and the default cwd
	// (default Workspace). Absolute paths under /workspace are mapped to it.
	Workspace string
	// StateDir holds each exec's log and status (default StateDir).
	StateDir string
	// DefaultMaxLogBytes bounds an exec's log when its request does not (default 64 MiB).
	DefaultMaxLogBytes int64
	// BaseEnv is every exec's starting environment (default DefaultBaseEnv()).
	BaseEnv []string
	// Reap selects the PID-1 strategy: one SIGCHLD loop reaps every child and orphan. Without
	// it each process is waited for on its own (tests, a server on the host). Only one server
	// per process may reap. When the process is not PID 1 it becomes a child subreaper.
	Reap bool
	// MaxRunning bounds concurrent execs (default 1024); beyond it StartExec answers
	// ErrCodeUnavailable.
	MaxRunning int
	// KeepEnded is how many ended execs are kept (default 1000); the oldest are forgotten
	// and their files deleted.
	KeepEnded int
	// KeepEndedBytes bounds the bytes the logs of ended execs other than the newest one keep
	// together (default DefaultMaxLogBytes): beyond it the oldest are forgotten too. The logs
	// live in a tmpfs the sandbox's memory limit counts, and the control plane has copied an
	// ended exec's output by the time it reads the exit record, so a sandbox that runs many
	// commands with large output is not killed by its own history.
	KeepEndedBytes int64
	// Cgroups, when set, tracks each exec's processes in a cgroup of its own (OpenCgroups:
	// PID 1 inside a sandbox only), so that a timeout, signal or Close reaches every process
	// an exec started, whatever it did to its session, group or environment. Without it they
	// are tracked by process group and parentage, which misses processes that left the group
	// and were re-parented (see killTree). The server does not close it.
	Cgroups *Cgroups
	// ImportWriters is how many goroutines write the content of small files during a
	// workspace import (PUT /v1/workspace/tar) while the tar is read on (0: the reading
	// goroutine writes every file). See fileWriters.
	ImportWriters int
	// Spawner is the path of the spawner program (guest/spawner) in the box: with Reap, Warm
	// starts it and it starts the execs' processes from then on (spawner.go). Empty: PID 1
	// forks each one itself.
	Spawner string
	// Quiesce, when set, closes the init's host socket for a pause (POST /v1/quiesce, see
	// proto/pause.go) and reports whether it was open. Without it the endpoint refuses.
	Quiesce func() (closed bool, err error)
	// Logger receives the few things worth logging (default slog.Default()).
	Logger *slog.Logger
}

// Server is the guest init: it owns every exec it starts and serves the protocol over any
// number of connections.
type Server struct {
	opts    Options
	ws      string
	waiter  waiter
	h2      *http2.Server
	handler http.Handler // the routes
	wrapped http.Handler // the routes behind the closing check
	log     *slog.Logger
	devNull *os.File // every exec's stdin without stdin data

	ctx    context.Context // cancelled by Close: ends followers
	cancel context.CancelFunc

	mu      sync.Mutex
	execs   map[string]*execState
	ended   []string // ids of ended execs, oldest first
	running int
	closed  bool
	conns   map[net.Conn]struct{}
	streams map[net.Conn]struct{} // the conns that carry an exec stream (stream.go)
	// spawner starts the execs' processes once Warm started it (nil: Go's fork). warmMu
	// keeps two Warms from starting two.
	spawner *spawner
	warmMu  sync.Mutex
	// spawnerEnds counts the spawner programs that ended other than by Close (spawnerEnded).
	spawnerEnds int
	// extraEnv is laid over opts.BaseEnv for every exec (PUT /v1/env, env.go).
	extraEnv []string
	// sparePipes are the next exec's output pipes, made ahead (refillPipes); nil: none.
	sparePipes *outputPipes
	// quiesces counts the pauses' quiesces (closeStreams): a connection that was there before
	// one never becomes an exec stream after it.
	quiesces uint64

	wg        sync.WaitGroup // exec supervisors, stdin writers
	handlers  sync.WaitGroup
	connsWG   sync.WaitGroup
	importMu  sync.Mutex
	closeOnce sync.Once

	watches *watchSet // file watches (watch.go)
	trash   *trashBin // trees a recursive delete removes in the background (fileops.go)
}

// New creates the server; with Reap it starts reaping at once.
func New(opts Options) (*Server, error) {
	if opts.Workspace == "" {
		opts.Workspace = proto.Workspace
	}
	if opts.StateDir == "" {
		opts.StateDir = proto.StateDir
	}
	if opts.DefaultMaxLogBytes <= 0 {
		opts.DefaultMaxLogBytes = 64 << 20
	}
	if opts.BaseEnv == nil {
		opts.BaseEnv = DefaultBaseEnv()
	}
	if opts.MaxRunning <= 0 {
		opts.MaxRunning = 1024
	}
	if opts.KeepEnded <= 0 {
		opts.KeepEnded = 1000
	}
	if opts.KeepEndedBytes <= 0 {
		opts.KeepEndedBytes = opts.DefaultMaxLogBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	ws, err := filepath.Abs(opts.Workspace)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return nil, fmt.Errorf("guest: workspace: %w", err)
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("guest: state dir: %w", err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("guest: %w", err)
	}
	s := &Server{
		devNull: devNull,
		opts:    opts,
		ws:      ws,
		log:     opts.Logger,
		execs:   make(map[string]*execState),
		conns:   make(map[net.Conn]struct{}),
		streams: make(map[net.Conn]struct{}),
		h2: &http2.Server{
			MaxConcurrentStreams:         1000,
			MaxReadFrameSize:             256 << 10,
			MaxUploadBufferPerConnection: 8 << 20,
			MaxUploadBufferPerStream:     4 << 20,
		},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.watches, s.trash = newWatchSet(s), newTrashBin(s.ctx, s)
	s.removeStaleImports()
	s.removeStaleTrash()
	if opts.Reap {
		s.waiter = startReaper()
	} else {
		s.waiter = waitEach{}
	}
	s.handler = s.routes()
	s.wrapped = s.Handler()
	return s, nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.handleHealth)
	mux.HandleFunc("POST /v1/execs", s.handleStartExec)
	mux.HandleFunc("GET /v1/execs", s.handleListExecs)
	mux.HandleFunc("GET /v1/execs/{id}", s.handleGetExec)
	mux.HandleFunc("DELETE /v1/execs/{id}", s.handleDeleteExec)
	mux.HandleFunc("GET /v1/execs/{id}/log", s.handleLog)
	mux.HandleFunc("POST /v1/execs/{id}/signal", s.handleSignal)
	mux.HandleFunc("POST /v1/execs/{id}/stdin", s.handleStdin)
	mux.HandleFunc("POST /v1/execs/{id}/resize", s.handleResize)
	mux.HandleFunc("GET /v1/files", s.handleReadFile)
	mux.HandleFunc("PUT /v1/files", s.handleWriteFile)
	mux.HandleFunc("DELETE /v1/files", s.handleRemove)
	mux.HandleFunc("GET /v1/dirs", s.handleListDir)
	mux.HandleFunc("GET /v1/stat", s.handleStat)
	mux.HandleFunc("POST /v1/mkdir", s.handleMkdir)
	mux.HandleFunc("POST /v1/move", s.handleMove)
	mux.HandleFunc("POST /v1/watches", s.handleCreateWatch)
	mux.HandleFunc("GET /v1/watches/{id}/events", s.handleWatchEvents)
	mux.HandleFunc("DELETE /v1/watches/{id}", s.handleDeleteWatch)
	mux.HandleFunc("GET /v1/workspace/tar", s.handleExport)
	mux.HandleFunc("PUT /v1/workspace/tar", s.handleImport)
	mux.HandleFunc("POST "+proto.QuiescePath, s.handleQuiesce)
	mux.HandleFunc("PUT "+proto.EnvPath, s.handleSetEnv)
	mux.HandleFunc("POST "+proto.ReleasePath, s.handleRelease)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errorf(proto.ErrCodeNotFound, "no endpoint %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// Handler is the protocol's HTTP handler (for serving it over something else than
// ServeConn). Once Close has begun it answers ErrCodeUnavailable.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			writeError(w, errShuttingDown())
			return
		}
		defer s.handlers.Done()
		s.handler.ServeHTTP(w, r)
	})
}

// enter counts a call in (Close waits for it) unless Close has begun; the caller calls
// s.handlers.Done when the call ends.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1) // under mu, so never concurrent with Close's Wait
	return true
}

func errShuttingDown() *proto.Error {
	return errorf(proto.ErrCodeUnavailable, "the guest init is shutting down")
}

// ServeConn serves HTTP/2 with prior knowledge on c until it breaks or Close is called.
func (s *Server) ServeConn(c net.Conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connsWG.Add(1)
	quiesces := s.quiesces
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
		s.connsWG.Done()
	}()
	bc := &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, connReadBuffer)}
	// The first bytes choose the protocol: HTTP/2's preface or an exec stream's hello. Both
	// come at once; an attach that sends neither is closed as HTTP/2 would close it.
	_ = c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	hello, err := bc.r.Peek(len(proto.StreamHello))
	if err != nil {
		return
	}
	if string(hello) == proto.StreamHello {
		_, _ = bc.r.Discard(len(hello))
		s.serveStream(c, bc.r, quiesces)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	s.h2.ServeConn(bc, &http2.ServeConnOpts{Context: s.ctx, Handler: s.wrapped})
}

// prefaceTimeout is how long a new attach may take to send its first bytes (HTTP/2's own
// wait for a client preface).
const prefaceTimeout = 10 * time.Second

// connReadBuffer is the read buffer of an attach stream. The HTTP/2 server reads its frames
// straight from the connection: a 9-byte header, then the payload, two reads per frame. While
// the host follows a log it answers every read of the body with two WINDOW_UPDATE frames (4-byte
// payloads): about 2,300 reads per 32 MiB of output, each a host context switch under gVisor.
// Buffered, one read takes whatever frames have arrived. A payload at least this large is still
// read straight into the framer's buffer.
const connReadBuffer = 32 << 10

// bufferedConn is an attach stream whose reads go through a buffer.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Close kills every running exec's tree, closes the connections and waits for the server's
// goroutines. Ended execs' files stay in StateDir.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		var running []*execState
		for _, e := range s.execs {
			if !e.log.isEnded() {
				running = append(running, e)
			}
		}
		conns := make([]net.Conn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()

		s.cancel()
		s.watches.closeAll()
		var kills sync.WaitGroup
		for _, e := range running {
			kills.Add(1)
			go func() {
				defer kills.Done()
				e.kill(syscall.SIGKILL)
			}()
		}
		kills.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
		s.wg.Wait()
		s.connsWG.Wait()
		s.handlers.Wait()
		s.trash.wait()
		sp := s.spawnerNow()
		if sp != nil {
			sp.close() // before the reaper stops: it takes the program's status
		}
		s.waiter.stop()
		_ = s.devNull.Close()
		s.mu.Lock()
		if s.sparePipes != nil {
			s.sparePipes.close()
			s.sparePipes = nil
		}
		s.mu.Unlock()
	})
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) lookup(id string) *execState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[id]
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	tracking := proto.TrackingProcessGroup
	if s.opts.Cgroups != nil {
		tracking = proto.TrackingCgroup
	}
	health := proto.Health{OK: true, Pid: os.Getpid(), Version: Version, ProcessTracking: tracking, ExecStreams: true}
	sp := s.spawnerNow()
	if sp != nil {
		health.SpawnerPid, health.SpawnerStarts = sp.state()
	}
	writeJSON(w, http.StatusOK, health)
}

func (s *Server) handleStartExec(w http.ResponseWriter, r *http.Request) {
	var req proto.ExecRequest
	if err := readJSON(r, &req, 64<<20); err != nil {
		writeError(w, err)
		return
	}
	info, err := s.startExec(req)
	if err != nil {
		writeError(w, err)
		return
	}
	if isTrue(r.URL.Query().Get("follow")) {
		// Start and follow in one round trip: the answer is the log from offset 0.
		if e := s.lookup(info.ID); e != nil {
			s.streamLog(w, r, e, 0, true, http.StatusCreated)
			return
		}
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) handleListExecs(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	execs := make([]*execState, 0, len(s.execs))
	for _, e := range s.execs {
		execs = append(execs, e)
	}
	s.mu.Unlock()
	infos := make([]proto.ExecInfo, 0, len(execs))
	for _, e := range execs {
		infos = append(infos, e.info())
	}
	slices.SortFunc(infos, func(a, b proto.ExecInfo) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	writeJSON(w, http.StatusOK, infos)
}

func (s *Server) handleGetExec(w http.ResponseWriter, r *http.Request) {
	e := s.lookup(r.PathValue("id"))
	if e == nil {
		writeError(w, errorf(proto.ErrCodeNotFound, "no exec %s", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, e.info())
}

// handleDeleteExec forgets an ended exec (forgetExec).
func (s *Server) handleDeleteExec(w http.ResponseWriter, r *http.Request) {
	if err := s.forgetExec(r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	e := s.lookup(r.PathValue("id"))
	if e == nil {
		writeError(w, errorf(proto.ErrCodeNotFound, "no exec %s", r.PathValue("id")))
		return
	}
	var req proto.SignalRequest
	if err := readJSON(r, &req, 4<<10); err != nil {
		writeError(w, err)
		return
	}
	name := strings.ToUpper(req.Signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig, ok := signals[name]
	if !ok {
		writeError(w, errorf(proto.ErrCodeInvalid, "unknown signal %q", req.Signal))
		return
	}
	e.kill(sig)
	writeJSON(w, http.StatusOK, e.info())
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// onlyWrite hides w's ReadFrom from io.CopyBuffer, which would use it and ignore the buffer it
// was given: os.File's ReadFrom, with no splice or copy_file_range path for the source (a
// request body, a tar entry), makes a 32 KiB buffer per call. Garbage in PID 1 means
// collections and pages given back, host round trips under gVisor.
func onlyWrite(w io.Writer) io.Writer { return struct{ io.Writer }{w} }

// handleLog streams an exec's log from an offset; with follow=1 until the exit record.
func (s *Server) handleLog(w http.ResponseWriter, r *http.Request) {
	e := s.lookup(r.PathValue("id"))
	if e == nil {
		writeError(w, errorf(proto.ErrCodeNotFound, "no exec %s", r.PathValue("id")))
		return
	}
	q := r.URL.Query()
	var off int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, errorf(proto.ErrCodeInvalid, "bad offset %q", v))
			return
		}
		off = n
	}
	s.streamLog(w, r, e, off, isTrue(q.Get("follow")), http.StatusOK)
}

// streamLog writes an exec's log from off, flushed as it grows; with follow until the exit
// record, without it until the current end. An off that is no longer kept (the log keeps the
// newest output) gets a RecordTruncated first, then the records from where the log resumes.
func (s *Server) streamLog(w http.ResponseWriter, r *http.Request, e *execState, off int64, follow bool, status int) {
	size, err := e.log.checkOffset(off)
	if err != nil {
		writeError(w, errorf(proto.ErrCodeInvalid, "%v", err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(proto.HeaderLogBytes, strconv.FormatInt(size, 10))
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if err := e.log.copyTo(ctx, w, rc.Flush, off, follow); errors.Is(err, errLogBroken) {
		panic(http.ErrAbortHandler) // the reader sees a broken stream, never a clean end
	}
}

// errorf makes a protocol error.
func errorf(code, format string, args ...any) *proto.Error {
	return &proto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":"internal","message":"encoding the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *proto.Error) {
	writeJSON(w, proto.HTTPStatus(e.Code), e)
}

func readJSON(r *http.Request, v any, max int64) *proto.Error {
	body := http.MaxBytesReader(nil, r.Body, max)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errorf(proto.ErrCodeTooLarge, "request body over %d bytes", max)
		}
		return errorf(proto.ErrCodeInvalid, "bad request body: %v", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 1<<10))
	return nil
}

func isTrue(v string) bool {
	b, _ := strconv.ParseBool(v)
	return b
}
