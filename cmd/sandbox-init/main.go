// Command sandbox-init is the guest init: PID 1 inside every sandbox, mounted read-only at
// /.sbx/init. It is a static binary (CGO_ENABLED=0).
//
//	sandbox-init [serve]   PID-1 mode: reap orphans, serve the guest protocol on the socket
//	sandbox-init connect   bridge stdin/stdout to the socket (what `runsc exec <id> /.sbx/init
//	                       connect` runs: the host speaks HTTP/2 over that stdio)
//	sandbox-init version   print the version
//	sandbox-init install DEST
//	                       copy this binary to DEST (mode 0755): what the Kubernetes driver's
//	                       init container runs to put the init into the pod's shared folder
//
// Environment overrides (for tests and for running the server on a host):
//
//	SBX_SOCKET     the unix socket (default /run/sbx/init.sock)
//	SBX_STATE_DIR  exec logs and status (default /run/sbx/execs)
//	SBX_WORKSPACE  the workspace (default /workspace)
//	SBX_REAP       1 or 0: reap every child with one SIGCHLD loop (default: only as PID 1;
//	               outside PID 1 the process becomes a child subreaper)
//
// The SBX_* variables are not passed on to execs.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"sandboxd/guest"
)

// connectWait is how long `connect` retries while PID 1 is not listening yet.
const connectWait = 10 * time.Second

func main() {
	cmd := "serve"
	if len(os.Args) > 1 {
		cmd = os.Args[1]
	}
	switch cmd {
	case "serve":
		os.Exit(serve())
	case "connect":
		os.Exit(connect())
	case "version", "-version", "--version":
		fmt.Println(guest.Version)
	case "install":
		if len(os.Args) != 3 {
			fmt.Fprintf(os.Stderr, "usage: %s install DEST\n", filepath.Base(os.Args[0]))
			os.Exit(2)
		}
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-init install: %v\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "usage: %s [serve|connect|version|install DEST]\n", filepath.Base(os.Args[0]))
		os.Exit(2)
	}
}

// install copies the running binary to dest (mode 0755) through a temporary file in dest's
// folder, so a reader never sees half a binary.
func install(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".install-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dest)
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func serve() int {
	if os.Getenv("GOMAXPROCS") == "" {
		// Under gVisor every hand-off between OS threads is a host context switch (a futex
		// wake through the sentry), which costs far more than the work the init does: one
		// thread runs all its goroutines, and blocking syscalls still get their own.
		runtime.GOMAXPROCS(1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "sandbox-init")
	sock := env("SBX_SOCKET", guest.SocketPath)
	reap := os.Getpid() == 1
	if v := os.Getenv("SBX_REAP"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			log.Error("bad SBX_REAP", "value", v)
			return 2
		}
		reap = b
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	srv, err := guest.NewServer(guest.ServerOptions{
		Workspace: env("SBX_WORKSPACE", guest.Workspace),
		StateDir:  env("SBX_STATE_DIR", guest.StateDir),
		Reap:      reap,
		Logger:    log,
	})
	if err != nil {
		log.Error("starting", "err", err)
		return 1
	}
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		log.Error("socket dir", "err", err)
		srv.Close()
		return 1
	}
	_ = os.Remove(sock) // stale, from an earlier run
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Error("listen", "socket", sock, "err", err)
		srv.Close()
		return 1
	}
	_ = os.Chmod(sock, 0o600)
	log.Info("serving", "socket", sock, "pid", os.Getpid(), "reap", reap, "version", guest.Version)

	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		acceptLoop(log, ln, srv, false)
	}()
	// The host socket: the runtime dials it from the host (no `runsc exec` per attach).
	var hostLn net.Listener
	hostAccepted := make(chan struct{})
	if hostSock := os.Getenv(guest.HostSocketEnv); hostSock != "" {
		_ = os.Remove(hostSock)
		hostLn, err = net.Listen("unix", hostSock)
		if err != nil {
			// Not fatal: attaches fall back to `init connect`.
			log.Warn("listen on the host socket", "socket", hostSock, "err", err)
		} else {
			_ = os.Chmod(hostSock, 0o600)
			go func() {
				defer close(hostAccepted)
				acceptLoop(log, hostLn, srv, true)
			}()
		}
	}

	sig := <-stop
	log.Info("stopping", "signal", sig.String())
	_ = ln.Close()
	<-accepted
	if hostLn != nil {
		_ = hostLn.Close()
		<-hostAccepted
	}
	srv.Close()
	_ = os.Remove(sock)
	return 0
}

// acceptLoop serves every connection of ln until it closes. ready says to write the
// ConnectReady byte first (on the host socket, where no `connect` does it).
func acceptLoop(log *slog.Logger, ln net.Listener, srv *guest.Server, ready bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func() {
			if ready {
				if _, err := c.Write([]byte{guest.ConnectReady}); err != nil {
					_ = c.Close()
					return
				}
			}
			srv.ServeConn(c)
		}()
	}
}

func connect() int {
	sock := env("SBX_SOCKET", guest.SocketPath)
	deadline := time.Now().Add(connectWait)
	var c *net.UnixConn
	for {
		var err error
		c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "sandbox-init connect: %v\n", err)
			return 1
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Tell the host the init is up before any protocol byte (guest.ConnectReady).
	if _, err := os.Stdout.Write([]byte{guest.ConnectReady}); err != nil {
		_ = c.Close()
		return 1
	}
	// stdin → socket; on stdin EOF half-close, the server then ends the connection.
	go func() {
		_ = relay(c, os.Stdin)
		_ = c.CloseWrite()
	}()
	// socket → stdout until the server closes or the host stops reading.
	_ = relay(os.Stdout, c)
	_ = c.Close()
	return 0
}

// relay copies with plain reads and writes (no splice or sendfile fast paths, which the
// sandbox kernel may implement differently) and one write per read.
func relay(dst io.Writer, src io.Reader) error {
	buf := make([]byte, 256<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
