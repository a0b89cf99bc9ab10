package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"

	utilexec "k8s.io/client-go/util/exec"

	"sandboxd/guest/client"
	"sandboxd/internal/exportend"
)

// exportAttempts bounds how many times a workspace export is run for one read: a cut
// connection is read again from where it stopped, twice at most.
const exportAttempts = 3

// errExportCut is a read whose stream lost its tail every time it was run.
var errExportCut = errors.New("the stream was cut before its end")

// runExport runs the export once, its stdout and stderr into the writers given; nil when the
// command exited 0 (which a cut connection may also report: the end mark tells).
type runExport func(ctx context.Context, stdout, stderr io.Writer) error

// resumeExport copies the export's stream to w, whole or not at all. The export ends its
// stderr with an end mark (exportend): the bytes it wrote and their SHA-256. A run whose
// stream fell short of the mark, or whose mark never came, lost its tail on the way (an API
// server that closes a connection it has unread bytes of resets it, and what was still in its
// buffers is gone, while the client may see a clean end); so does one that failed other than
// by the command's exit status. Such a run is done again: its first bytes, the ones w already
// has, are skipped, and the mark's SHA-256 then proves the two runs' bytes the same (the
// export of a stopped box's read-only volume is the same stream each time). Every byte given
// to w is checked so; an error is returned rather than a stream that is short or mixed.
func resumeExport(ctx context.Context, w io.Writer, run runExport, log *slog.Logger) error {
	h := sha256.New()
	var sent int64
	for attempt := 1; ; attempt++ {
		stderr := &capped{max: 4 << 10}
		tail := &tailWriter{t: client.Tail{Limit: 512}}
		sink := &skipWriter{w: w, h: h, skip: sent}
		err := run(ctx, sink, io.MultiWriter(stderr, tail))
		sent += sink.written
		var exit utilexec.ExitError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &exit):
			// The export failed: its exit status and what it said, never a retry.
			if msg := stderr.String(); msg != "" {
				err = fmt.Errorf("%w (stderr: %s)", err, msg)
			}
			return err
		case err == nil:
			n, sum, ok := exportend.Parse(tail.String())
			if ok && n == sent {
				if !bytes.Equal(sum, h.Sum(nil)) {
					return fmt.Errorf("the stream's %d bytes do not match its end mark's SHA-256 (a run read again gave other bytes)", sent)
				}
				return nil
			}
			if ok && n < sent {
				return fmt.Errorf("the export wrote %d bytes and %d were read (a run read again gave a shorter stream)", n, sent)
			}
			err = fmt.Errorf("%w: %d bytes read, and %s", errExportCut, sent, markSaid(ok, n))
		}
		if attempt == exportAttempts {
			return fmt.Errorf("%w (run %d times)", err, attempt)
		}
		log.Info("workspace reader: the export's stream was cut or its run failed; running it again for the rest",
			"bytes", sent, "attempt", attempt, "err", err)
	}
}

func markSaid(ok bool, n int64) string {
	if !ok {
		return "no end mark"
	}
	return fmt.Sprintf("the end mark says %d", n)
}

// skipWriter drops the first skip bytes written to it (a run read again: w has them), then
// writes to w, hashing and counting what w took.
type skipWriter struct {
	w       io.Writer
	h       hash.Hash
	skip    int64
	written int64
}

func (s *skipWriter) Write(p []byte) (int, error) {
	all := len(p)
	if s.skip > 0 {
		k := min(s.skip, int64(len(p)))
		s.skip -= k
		p = p[k:]
	}
	if len(p) == 0 {
		return all, nil
	}
	n, err := s.w.Write(p)
	s.h.Write(p[:n])
	s.written += int64(n)
	if err != nil {
		return all - len(p) + n, err
	}
	return all, nil
}

// tailWriter is client.Tail as an io.Writer: the end of stderr, where the end mark is.
type tailWriter struct{ t client.Tail }

func (w *tailWriter) Write(p []byte) (int, error) {
	w.t.Write(p)
	return len(p), nil
}

func (w *tailWriter) String() string { return string(w.t.Bytes()) }
