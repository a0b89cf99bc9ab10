// Package localredis runs the Redis of a single-host sandboxd: a real redis-server, a child
// process of sandboxd, listening only on a unix socket in the state folder (no TCP port), with
// its append-only file (AOF) there too, so that a restart of sandboxd, of the redis-server or
// of the machine forgets nothing that was fsynced. It supervises the child: it ends a leftover
// one from a sandboxd that was killed (by the PID in its pidfile, after checking that the
// process is a redis-server working in this folder), waits until the new one answers PING,
// restarts it with backoff when it exits, and SHUTDOWNs it (the AOF flushed) when closed. The
// child gets SIGTERM when sandboxd dies, even by SIGKILL (Pdeathsig), and runs in its own
// process group, so that a Ctrl-C meant for sandboxd does not stop it before sandboxd has
// finished with it.
package localredis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// File names inside the folder.
const (
	SocketName  = "redis.sock"
	pidName     = "redis-server.pid"
	lockName    = "sandboxd.lock"
	logName     = "redis.log"
	maxSockPath = 107 // sun_path holds 108 bytes with the terminating NUL
)

// Options are what Start needs.
type Options struct {
	Config
	// Dir is the folder of the socket, the AOF, the log and the pidfile (<state dir>/redis).
	Dir    string
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for the first PING answer after a start (loading a large AOF
	// takes a while); default 60 s.
	ReadyTimeout time.Duration
}

// Server is a supervised redis-server.
type Server struct {
	opts   Options
	bin    string
	dir    string
	sock   string
	log    *slog.Logger
	client *redis.Client // for PING, INFO and SHUTDOWN
	lock   *os.File

	restarts atomic.Int64
	up       atomic.Bool
	pid      atomic.Int64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// Start runs redis-server in opts.Dir and returns once it answers PING. A missing binary is an
// error naming the Debian package. Close stops it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	bin, err := exec.LookPath(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("embedded redis: %s not found (%v): install Debian's redis-server package "+
			"(apt-get install redis-server; scripts/run-server.sh does), set redis.binary, or set REDIS_URL to use another Redis",
			opts.Binary, err)
	}
	maxmem, err := ParseBytes(opts.MaxMemory)
	if err != nil {
		return nil, fmt.Errorf("embedded redis: maxmemory: %w", err)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, SocketName)
	if len(sock) > maxSockPath {
		return nil, fmt.Errorf("embedded redis: the socket path %s is longer than %d bytes (a unix socket's limit): use a shorter state folder", sock, maxSockPath)
	}
	if err := privateDir(dir); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	s := &Server{opts: opts, bin: bin, dir: dir, sock: sock, log: log, lock: lock,
		client: redis.NewClient(&redis.Options{Network: "unix", Addr: sock, MaxRetries: -1, PoolSize: 2,
			DialTimeout: time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}),
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.endLeftover(); err != nil {
		s.client.Close()
		lock.Close()
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	args := []string{"--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", opts.AppendFsync, "--save", "",
		"--maxmemory", strconv.FormatInt(maxmem, 10), "--maxmemory-policy", "noeviction",
		"--protected-mode", "yes", "--daemonize", "no", "--logfile", filepath.Join(dir, logName)}
	ready := make(chan error, 1)
	go s.supervise(ctx, args, ready)
	if err := <-ready; err != nil {
		<-s.done
		s.client.Close()
		lock.Close()
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	log.Info("embedded Redis started (set REDIS_URL to use another one)", "socket", sock, "pid", s.pid.Load(),
		"appendfsync", opts.AppendFsync, "maxmemory", maxmem)
	return s, nil
}

// Socket is the path of the unix socket it listens on.
func (s *Server) Socket() string { return s.sock }

// ClientOptions are go-redis options that reach it.
func (s *Server) ClientOptions() *redis.Options {
	return &redis.Options{Network: "unix", Addr: s.sock}
}

// Restarts is how many times the child exited and was started again.
func (s *Server) Restarts() int64 { return s.restarts.Load() }

// Up reports whether the child runs and answered PING since it last started.
func (s *Server) Up() bool { return s.up.Load() }

// PID is the process id of the current child (0 while none runs).
func (s *Server) PID() int { return int(s.pid.Load()) }

// Close SHUTDOWNs the child (flushing the AOF) and stops supervising it. Call it after
// everything that uses Redis has stopped.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	s.client.Close()
	s.lock.Close() // releases the flock
}

// supervise starts the child and, until Close, starts it again whenever it exits. It holds its
// OS thread for its whole life: Pdeathsig fires when the thread that started a child exits, not
// the process, and Go may end an idle thread otherwise. ready gets the first start's result.
func (s *Server) supervise(ctx context.Context, args []string, ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
	defer close(s.done)
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	first := true
	for {
		cmd, exited, err := s.spawn(ctx, args)
		if err == nil {
			s.up.Store(true)
		}
		if first {
			ready <- err
			if err != nil {
				return
			}
			first = false
		}
		if err == nil {
			started := time.Now()
			select {
			case <-s.stop:
				s.shutdown(cmd, exited)
				return
			case <-exited:
			}
			s.up.Store(false)
			s.pid.Store(0)
			if time.Since(started) > 30*time.Second {
				backoff = minBackoff
			}
			s.log.Error("embedded Redis exited; restarting it", "exit", cmd.ProcessState.String(), "in", backoff,
				"log", filepath.Join(s.dir, logName))
		} else {
			s.log.Error("embedded Redis did not start; retrying", "err", err, "in", backoff)
		}
		s.restarts.Add(1)
		select {
		case <-s.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// spawn starts one child and waits until it answers PING. exited is closed when it has exited
// (and been waited for).
func (s *Server) spawn(ctx context.Context, args []string) (*exec.Cmd, chan struct{}, error) {
	// A socket file left by a child killed with SIGKILL is removed by the next redis-server
	// itself (it unlinks the path before binding).
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", s.bin, err)
	}
	s.pid.Store(int64(cmd.Process.Pid))
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	if err := writeFileAtomic(filepath.Join(s.dir, pidName), []byte(strconv.Itoa(cmd.Process.Pid)+"\n")); err != nil {
		s.kill(cmd, exited)
		return nil, nil, fmt.Errorf("writing the pidfile: %w", err)
	}
	deadline := time.Now().Add(s.opts.ReadyTimeout)
	var last error
	for {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		last = s.client.Ping(pctx).Err()
		cancel()
		if last == nil {
			return cmd, exited, nil
		}
		select {
		case <-exited:
			return nil, nil, fmt.Errorf("redis-server exited at start (%s): %s", cmd.ProcessState, s.logTail())
		case <-s.stop:
			s.kill(cmd, exited)
			return nil, nil, errors.New("closed while starting")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill(cmd, exited)
			return nil, nil, fmt.Errorf("redis-server did not answer PING within %s (%v): %s", s.opts.ReadyTimeout, last, s.logTail())
		}
	}
}

// shutdown asks the child to SHUTDOWN (it fsyncs the AOF), and kills it by PID if it has not
// exited within 15 s.
func (s *Server) shutdown(cmd *exec.Cmd, exited chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := s.client.Shutdown(ctx).Err()
	cancel()
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		s.log.Warn("embedded Redis did not shut down; killing it", "pid", cmd.Process.Pid, "shutdown_err", err)
		s.kill(cmd, exited)
	}
	s.up.Store(false)
	s.pid.Store(0)
	_ = os.Remove(filepath.Join(s.dir, pidName))
	s.log.Info("embedded Redis stopped", "exit", cmd.ProcessState.String())
}

func (s *Server) kill(cmd *exec.Cmd, exited chan struct{}) {
	_ = cmd.Process.Kill()
	<-exited
}

// endLeftover ends a redis-server left running in this folder by an earlier sandboxd (one that
// lost its Pdeathsig, e.g. when it was started by a thread that is gone). It is found by the
// PID in the pidfile and ended by that PID only after checking that it is a redis-server whose
// working directory is this folder, so that a recycled PID is never signalled.
func (s *Server) endLeftover() error {
	b, err := os.ReadFile(filepath.Join(s.dir, pidName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return os.Remove(filepath.Join(s.dir, pidName))
	}
	if !s.isOurs(pid) {
		return os.Remove(filepath.Join(s.dir, pidName))
	}
	s.log.Warn("ending a redis-server left running in the state folder", "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGTERM) // it flushes its AOF and exits
	deadline := time.Now().Add(15 * time.Second)
	for s.isOurs(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return os.Remove(filepath.Join(s.dir, pidName))
}

// isOurs reports whether pid runs a redis-server (not a zombie) working in s.dir.
func (s *Server) isOurs(pid int) bool {
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil || cwd != s.dir {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": comm is redis-server (or redis-check-aof when run under that name).
	open, close := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || close < open || close+2 >= len(stat) {
		return false
	}
	return strings.HasPrefix(string(stat[open+1:close]), "redis-") && stat[close+2] != 'Z'
}

// logTail is the end of the child's log, for errors.
func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, logName))
	if err != nil {
		return "no log: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}

// privateDir makes dir (a real folder, not a link) readable by its owner only.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a folder", dir)
	}
	return os.Chmod(dir, 0o700)
}

// lockDir takes an exclusive flock on dir's lock file: one sandboxd per folder.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s is locked by another sandboxd (one embedded Redis per state folder): %w", dir, err)
	}
	return f, nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
