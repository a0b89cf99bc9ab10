package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/klauspost/compress/zstd"

	"sandboxd/guest/server"
	"sandboxd/internal/exportend"
	"sandboxd/internal/zframes"
)

// The workspace reader's two commands. The Kubernetes driver reads a stopped sandbox's
// workspace beside it: a short-lived pod on the cluster's native runtime mounts the sandbox's
// PVC read-only and runs `idle` as its process; the driver execs `export` in it and reads the
// compressed tar from its stdout. Nothing of the tenant's runs there: the reader only walks
// the files, never following a symlink (server.WriteTarReadahead), and a tree the tenant made
// hostile (FIFOs, devices, links out of the workspace, names of every kind) is what that walk
// is written for.

// idle waits for SIGTERM or SIGINT: the reader pod's process, which keeps the pod running
// while the driver execs into it.
func idle() int {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	return 0
}

// exportDir writes the tree under dir to stdout as a zstd-compressed tar: independent frames
// of 1 MiB compressed on every core (zframes, the checkpoint store's own format, which it then
// keeps as it comes), and reports the number of entries on stderr, then the end mark: the
// bytes written and their SHA-256 (exportend), by which the driver tells a stream that lost its
// tail on the way from one that ended. A failure exits non-zero: the driver then refuses the
// stream, even if what came before it decodes.
func exportDir(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sandbox-init export DIR")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
	defer stop()
	// The walk writes the tar into a pipe; the compressor reads it, compresses its frames on
	// every core and writes them to stdout in order.
	pr, pw := io.Pipe()
	var files int
	walked := make(chan error, 1)
	go func() {
		var err error
		files, err = server.WriteTarReadahead(ctx, args[0], pw)
		pw.CloseWithError(err)
		walked <- err
	}()
	out := &hashingWriter{w: os.Stdout, h: sha256.New()}
	_, err := zframes.New(runtime.GOMAXPROCS(0), zstd.SpeedFastest).Compress(ctx, out, pr)
	pr.CloseWithError(errors.New("the compressor stopped"))
	if werr := <-walked; werr != nil {
		err = werr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init export: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "%d entries\n", files)
	fmt.Fprint(os.Stderr, exportend.Line(out.n, out.h.Sum(nil)))
	return 0
}

// hashingWriter counts and hashes what it writes to w.
type hashingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (h *hashingWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	return n, err
}
