// Command sandbox-init is the guest init: PID 1 inside every sandbox, mounted read-only at
// /.sbx/init. It is a static binary (CGO_ENABLED=0).
//
//	sandbox-init [serve]   PID-1 mode: reap orphans, serve the guest protocol on the socket
//	sandbox-init connect   bridge stdin/stdout to the socket (what `runsc exec <id> /.sbx/init
//	                       connect` runs: the host speaks HTTP/2 over that stdio)
//	sandbox-init connect provision KEYFILE
//	                       the same, after taking the box's channel key from the first line of
//	                       stdin and writing it to KEYFILE for a PID 1 that waits for it
//	                       (SBX_CHANNEL_KEY_AWAIT=1; provision.go): a Kubernetes pod whose image
//	                       carries the init, on the runtime's first attach. The Kubernetes
//	                       runtime runs the C twin of connect (guest/connect) instead where the
//	                       image or the init image carries it, and this where it does not
//	sandbox-init idle      wait for SIGTERM: the process of the Kubernetes driver's workspace
//	                       reader pod (reader.go)
//	sandbox-init export DIR
//	                       write DIR as a zstd-compressed tar to stdout, never following a
//	                       symlink: what the driver execs in that pod to read a stopped
//	                       sandbox's PVC beside it
//	sandbox-init version   print the version, revision and Go version (also --version)
//	sandbox-init install DEST
//	                       copy this binary to DEST (mode 0755): what the Kubernetes driver's
//	                       init container runs to put the init into the pod's shared folder;
//	                       with SBX_CHANNEL_KEY and SBX_CHANNEL_KEY_FILE set it also writes
//	                       the box's channel key to that file for PID 1 (see guest/proto/channel.go);
//	                       a sandbox-spawn and a sandbox-connect beside this binary (the
//	                       spawner and connect programs) are copied to DEST's folder as
//	                       spawn and connect
//
// PID 1 makes itself non-dumpable, takes its channel key (SBX_CHANNEL_KEY_FILE: read, then
// deleted) and serves a connection only once the caller proved that key. Started with
// CAP_SYS_ADMIN (the local runtime does), it first opens the exec cgroups, hides its exec
// state folder and its host socket's folder, and then drops CAP_SYS_ADMIN on every thread
// (setup.go).
//
// Environment overrides (for tests and for running the server on a host):
//
//	SBX_SOCKET     the unix socket (default @sbx-init: an abstract socket, which nothing in
//	               the box can unlink or replace; a path for a socket file)
//	SBX_STATE_DIR  exec logs, <exec id>.log.<n> (default /run/sbx/execs)
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
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/guest/server"
	"sandboxd/internal/version"
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
		os.Exit(connect(os.Args[2:]))
	case "idle":
		os.Exit(idle())
	case "export":
		os.Exit(exportDir(os.Args[2:]))
	case "version", "-version", "--version":
		fmt.Println(version.String("sandbox-init"))
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
		fmt.Fprintf(os.Stderr, "usage: %s [serve|connect|version|install DEST|idle|export DIR]\n", filepath.Base(os.Args[0]))
		os.Exit(2)
	}
}

// install copies the running binary to dest (mode 0755) through a temporary file in dest's
// folder, so a reader never sees half a binary, and writes the channel key from
// SBX_CHANNEL_KEY to SBX_CHANNEL_KEY_FILE when both are set. The spawner program, when it is
// beside the binary (sandbox-spawn), goes beside dest as spawn (proto.SpawnerEnv), and the
// connect program (sandbox-connect) as connect (runtime/kube's attach).
func install(dest string) error {
	if k, kf := os.Getenv(proto.ChannelKeyEnv), os.Getenv(proto.ChannelKeyFileEnv); k != "" && kf != "" {
		if _, err := proto.ParseChannelKey(k); err != nil {
			return err
		}
		if err := os.WriteFile(kf, []byte(k), 0o400); err != nil {
			return fmt.Errorf("writing the channel key: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := copyExecutable(self, dest); err != nil {
		return err
	}
	for _, p := range []struct{ from, to string }{{"sandbox-spawn", "spawn"}, {"sandbox-connect", "connect"}} {
		src := filepath.Join(filepath.Dir(self), p.from)
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := copyExecutable(src, filepath.Join(filepath.Dir(dest), p.to)); err != nil {
			return err
		}
	}
	return nil
}

// copyExecutable copies the file src to dest (mode 0755) through a temporary file in dest's
// folder.
func copyExecutable(srcPath, dest string) error {
	src, err := os.Open(srcPath)
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
	began := time.Now()
	pid1 := os.Getpid() == 1
	if pid1 {
		// First of all: nothing in the box may read this process's memory, environment or
		// descriptors (the channel key lives in its memory).
		if err := notDumpable(); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-init: making PID 1 non-dumpable: %v\n", err)
			return 1
		}
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// Under gVisor every hand-off between OS threads is a host context switch (a futex
		// wake through the sentry), which costs far more than the work the init does: one
		// thread runs all its goroutines, and blocking syscalls still get their own.
		runtime.GOMAXPROCS(1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "sandbox-init")
	sock := env("SBX_SOCKET", proto.SocketPath)
	reap := pid1
	if v := os.Getenv("SBX_REAP"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			log.Error("bad SBX_REAP", "value", v)
			return 2
		}
		reap = b
	}
	// SIGTERM and SIGINT stop the init, unless the runtime never sends them
	// (proto.StopSignalsEnv): then only a command in the box could, and PID 1 ignores them.
	stop := make(chan os.Signal, 1)
	stray := straySignals
	if pid1 && os.Getenv(proto.StopSignalsEnv) == "0" {
		stray = append(slices.Clip(stray), syscall.SIGTERM, syscall.SIGINT)
	} else {
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	}
	if pid1 {
		ignoreSignals(log, stray)
	}
	// The channel key: read and deleted before anything else of the box runs. A runtime that
	// names a key file wants every connection to prove the key; without one (a test on a host)
	// connections are served as they come. A runtime that brings the key with its first attach
	// (proto.ChannelKeyAwaitEnv) has PID 1 wait for the file: nothing listens, so nothing can
	// run in the box, until it is there.
	var key []byte
	if kf := os.Getenv(proto.ChannelKeyFileEnv); kf != "" {
		if os.Getenv(proto.ChannelKeyAwaitEnv) == "1" && !awaitFile(kf, stop) {
			log.Info("stopped before the runtime brought the channel key")
			return 0
		}
		k, err := server.TakeChannelKey(kf)
		if err != nil {
			log.Error("reading the channel key", "err", err)
			return 1
		}
		key = k
	}

	// A runtime that gives PID 1 CAP_SYS_ADMIN asks for every step below to be done
	// (proto.RequireContainmentEnv): a box never runs with less than it promised.
	strict := os.Getenv(proto.RequireContainmentEnv) == "1"
	privileged := pid1 && hasCap(capSysAdmin)
	if strict && !privileged {
		log.Error("the runtime requires containment, but this process is not PID 1 with CAP_SYS_ADMIN")
		return 1
	}
	var cgroups *server.Cgroups
	if privileged {
		cg, err := server.OpenCgroups()
		switch {
		case err != nil && strict:
			log.Error("opening the exec cgroups", "err", err)
			return 1
		case err != nil:
			// Execs are then tracked by process group and parentage only.
			log.Warn("opening the exec cgroups; tracking processes by group and parent instead", "err", err)
		default:
			cgroups = cg
		}
	}
	// host is the listener on the host socket, made below once the server exists; the
	// server's quiesce (a pause) closes it.
	var host *hostSocket
	opts := server.Options{
		Workspace: env("SBX_WORKSPACE", proto.Workspace),
		StateDir:  env("SBX_STATE_DIR", proto.StateDir),
		Reap:      reap,
		Cgroups:   cgroups,
		Spawner:   os.Getenv(proto.SpawnerEnv),
		Logger:    log,
	}
	if privileged {
		// The exec logs leave the box's sight too; PID 1 keeps them through a descriptor.
		via, err := hideStateDir(opts.StateDir)
		switch {
		case err != nil && strict:
			log.Error("hiding the exec state folder", "err", err)
			return 1
		case err != nil:
			log.Warn("hiding the exec state folder; commands can reach their logs", "err", err)
		default:
			opts.StateDir = via
		}
	}
	if os.Getenv(proto.HostSocketEnv) != "" {
		opts.Quiesce = func() (bool, error) {
			if host == nil {
				return false, nil // it never listened: nothing of the host's to close
			}
			return host.quiesce()
		}
	}
	srv, err := server.New(opts)
	if err != nil {
		log.Error("starting", "err", err)
		return 1
	}
	if !isAbstract(sock) {
		if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
			log.Error("socket dir", "err", err)
			srv.Close()
			return 1
		}
		_ = os.Remove(sock) // stale, from an earlier run
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Error("listen", "socket", sock, "err", err)
		srv.Close()
		return 1
	}
	chmodSocket(sock)

	// The host socket: the runtime dials it from the host (no `runsc exec` per attach). A
	// pause closes it and a restore opens it again (hostsock.go).
	if hostSock := os.Getenv(proto.HostSocketEnv); hostSock != "" {
		h, err := listenHost(log, srv, key, hostSock)
		if err != nil {
			// Not fatal: attaches fall back to `init connect`.
			log.Warn("listen on the host socket", "socket", hostSock, "err", err)
		}
		host = h
		// Listening or not, the folder leaves the box's sight.
		if privileged {
			if err := hideDir(filepath.Dir(hostSock)); err != nil {
				log.Error("hiding the host socket's folder", "err", err)
				srv.Close()
				return 1
			}
		}
	}
	if privileged {
		// PID 1's own mounts are done: from here on nothing in the box mounts a file system (a
		// command in a user namespace of its own could otherwise mount a view of the exec
		// cgroups and leave its own, or try to uncover the hidden folder).
		seal := server.RefuseMounts
		if cgroups != nil {
			seal = cgroups.Seal
		}
		if err := seal(); err != nil {
			log.Error("refusing mounts in the box", "err", err)
			srv.Close()
			return 1
		}
	}
	if privileged {
		if err := dropCap(capSysAdmin, cgroups == nil); err != nil {
			log.Error("dropping CAP_SYS_ADMIN", "err", err)
			srv.Close()
			return 1
		}
	}
	log.Info("serving", "socket", sock, "pid", os.Getpid(), "reap", reap, "version", server.Version,
		"channel_key", key != nil, "cgroups", cgroups != nil, "setup_ms", float64(time.Since(began).Microseconds())/1000)

	// The first fork through the spawner costs more than the others (gVisor sets up the
	// filter's state then): pay it now, while the runtime attaches.
	go func() {
		if err := srv.Warm(); err != nil {
			log.Warn("warming up exec starts", "err", err)
		}
	}()

	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		acceptLoop(log, ln, srv, key, false)
	}()

	// After a restore the runtime asks for the host socket again (proto.ReopenSignal, which
	// is SIGUSR2; hostSocket.reopen checks the runtime's marker).
	reopen := make(chan os.Signal, 1)
	if host != nil {
		signal.Notify(reopen, syscall.SIGUSR2)
	}
	var sig os.Signal
	for sig == nil {
		select {
		case sig = <-stop:
		case <-reopen:
			host.reopen()
		}
	}
	log.Info("stopping", "signal", sig.String())
	_ = ln.Close()
	<-accepted
	if host != nil {
		host.close()
	}
	srv.Close()
	if !isAbstract(sock) {
		_ = os.Remove(sock)
	}
	return 0
}

// handshakeTimeout bounds a connection's channel handshake.
const handshakeTimeout = 10 * time.Second

// acceptLoop serves every connection of ln until it closes. ready says to write the
// ConnectReady byte first (on the host socket, where no `connect` does it). With a key, a
// connection is served only once the caller proved it (server.InitHandshake).
func acceptLoop(log *slog.Logger, ln net.Listener, srv *server.Server, key []byte, ready bool) {
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
				if _, err := c.Write([]byte{proto.ConnectReady}); err != nil {
					_ = c.Close()
					return
				}
			}
			if key != nil {
				_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
				if err := server.InitHandshake(c, key); err != nil {
					if errors.Is(err, server.ErrHostUnproven) {
						log.Warn("refused a connection that did not prove the channel key", "err", err)
					}
					_ = c.Close()
					return
				}
				_ = c.SetDeadline(time.Time{})
			}
			srv.ServeConn(c)
		}()
	}
}

func connect(args []string) int {
	// A relay of the runtime's own stream: nothing in the box may trace or read it, and it
	// needs no privilege at all.
	_ = notDumpable()
	if err := clearCaps(); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init connect: %v\n", err)
		return 1
	}
	sock := env("SBX_SOCKET", proto.SocketPath)
	dial := func() (*net.UnixConn, error) {
		return net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	}
	var c *net.UnixConn
	switch {
	case len(args) == 0:
	case len(args) == 2 && args[0] == proto.ConnectProvision:
		var err error
		if c, err = provision(os.Stdin, args[1], dial); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-init connect: %v\n", err)
			return 1
		}
	default:
		fmt.Fprintf(os.Stderr, "usage: sandbox-init connect [%s KEYFILE]\n", proto.ConnectProvision)
		return 2
	}
	deadline := time.Now().Add(connectWait)
	for c == nil {
		var err error
		c, err = dial()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "sandbox-init connect: %v\n", err)
			return 1
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(args) == 2 {
		// PID 1 listens, so it took its key: whatever is left of the file is stale.
		if err := os.Remove(args[1]); err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "sandbox-init connect: removing the key file: %v\n", err)
			_ = c.Close()
			return 1
		}
	}
	// Tell the host the init is up before any protocol byte (proto.ConnectReady).
	if _, err := os.Stdout.Write([]byte{proto.ConnectReady}); err != nil {
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
