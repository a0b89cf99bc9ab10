package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	utilexec "k8s.io/client-go/util/exec"

	"sandboxd/internal/exportend"
)

// fakeExport is an export of stream: each run writes the first cut[i] bytes of run i's stream
// (all when cut is short of it, or -1), and the end mark (of the whole stream) unless the run
// lost it with its tail, then returns err[i].
type fakeExport struct {
	streams [][]byte // the stream of each run; the last one repeats
	cut     []int
	marks   []bool // the end mark arrives; default true
	errs    []error
	runs    int
}

func (f *fakeExport) run(_ context.Context, stdout, stderr io.Writer) error {
	i := f.runs
	f.runs++
	stream := f.streams[min(i, len(f.streams)-1)]
	n := len(stream)
	if i < len(f.cut) && f.cut[i] >= 0 {
		n = f.cut[i]
	}
	for p := stream[:n]; len(p) > 0; { // in pieces, as a connection delivers it
		k := min(len(p), 1000)
		if _, err := stdout.Write(p[:k]); err != nil {
			return err
		}
		p = p[k:]
	}
	io.WriteString(stderr, "3 entries\n")
	if i >= len(f.marks) || f.marks[i] {
		sum := sha256.Sum256(stream)
		io.WriteString(stderr, exportend.Line(int64(len(stream)), sum[:]))
	}
	if i < len(f.errs) {
		return f.errs[i]
	}
	return nil
}

func stream(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestResumeExport(t *testing.T) {
	whole := stream(10_000, 1)
	transport := errors.New("connection reset by peer")
	for _, tt := range []struct {
		name string
		f    fakeExport
		runs int
	}{
		{"whole", fakeExport{streams: [][]byte{whole}}, 1},
		{"cut, no mark (a clean end that lost its tail)", fakeExport{streams: [][]byte{whole}, cut: []int{3500}, marks: []bool{false}}, 2},
		{"cut, the mark came", fakeExport{streams: [][]byte{whole}, cut: []int{4000}}, 2},
		{"cut twice", fakeExport{streams: [][]byte{whole}, cut: []int{1000, 6000}, marks: []bool{false, false}}, 3},
		{"cut with a transport error", fakeExport{streams: [][]byte{whole}, cut: []int{2500}, marks: []bool{false}, errs: []error{transport}}, 2},
		{"nothing, then whole", fakeExport{streams: [][]byte{whole}, cut: []int{0}, marks: []bool{false}}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got bytes.Buffer
			if err := resumeExport(context.Background(), &got, tt.f.run, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), whole) {
				t.Errorf("got %d bytes, want the %d of the stream exactly once", got.Len(), len(whole))
			}
			if tt.f.runs != tt.runs {
				t.Errorf("ran %d times, want %d", tt.f.runs, tt.runs)
			}
		})
	}
}

// Whatever cannot be made whole ends with an error, never with a stream that looks whole.
func TestResumeExportRefuses(t *testing.T) {
	whole, other := stream(10_000, 1), stream(10_000, 2)
	exit := utilexec.CodeExitError{Err: errors.New("command terminated with exit code 1"), Code: 1}
	for _, tt := range []struct {
		name, want string
		f          fakeExport
		runs       int
	}{
		{"always cut", "cut before its end", fakeExport{streams: [][]byte{whole}, cut: []int{100, 200, 300}, marks: []bool{false, false, false}}, 3},
		{"another stream the second time", "do not match", fakeExport{streams: [][]byte{whole, other}, cut: []int{5000}, marks: []bool{false}}, 2},
		{"a shorter stream the second time", "shorter", fakeExport{streams: [][]byte{whole, whole[:3000]}, cut: []int{5000}, marks: []bool{false}}, 2},
		{"the export failed", "exit code 1", fakeExport{streams: [][]byte{whole}, cut: []int{100}, errs: []error{exit}}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := resumeExport(context.Background(), io.Discard, tt.f.run, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			}
			if tt.f.runs != tt.runs {
				t.Errorf("ran %d times, want %d", tt.f.runs, tt.runs)
			}
		})
	}
	t.Run("the export's stderr is in its failure", func(t *testing.T) {
		f := fakeExport{streams: [][]byte{whole}, errs: []error{exit}}
		if err := resumeExport(context.Background(), io.Discard, f.run, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "3 entries") {
			t.Errorf("got %v, want the export's stderr in it", err)
		}
	})
	t.Run("the reader gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		f := fakeExport{streams: [][]byte{whole}, cut: []int{100}, marks: []bool{false}}
		if err := resumeExport(ctx, io.Discard, f.run, slog.New(slog.DiscardHandler)); !errors.Is(err, context.Canceled) || f.runs != 1 {
			t.Errorf("got %v after %d runs, want context.Canceled after 1", err, f.runs)
		}
	})
}
