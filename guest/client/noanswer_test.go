package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// silentInit is a peer that speaks like a guest init and offers exec streams, but answers no
// start: a box whose PID 1 took the request and then stopped (SIGSTOP from outside, starved).
type silentInit struct {
	c *client.Client
	// httpStarts counts starts that reached it over HTTP/2; httpGaveUp those whose request
	// the client then cancelled.
	httpStarts, httpGaveUp atomic.Int64
	// streams counts exec streams dialled; streamReads the bytes read on them; streamsClosed
	// those the client closed.
	streams, streamReads, streamsClosed atomic.Int64
}

func newSilentInit(t *testing.T) *silentInit {
	t.Helper()
	s := &silentInit{}
	var peers atomic.Int64
	t.Cleanup(func() { // after the client's end (cleanups run last first): its streams are closed
		for peers.Load() > 0 {
			time.Sleep(time.Millisecond)
		}
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true,"exec_streams":true}`)
	})
	mux.HandleFunc("POST /v1/execs", func(w http.ResponseWriter, r *http.Request) {
		s.httpStarts.Add(1)
		<-r.Context().Done()
		s.httpGaveUp.Add(1)
	})
	c := servePeer(t, mux)
	ok := c.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) {
		s.streams.Add(1)
		mine, theirs := net.Pipe()
		peers.Add(1)
		go func() {
			defer peers.Add(-1)
			n, _ := io.Copy(io.Discard, theirs) // reads the hello and the call; answers nothing
			s.streamReads.Add(n)
			s.streamsClosed.Add(1)
			theirs.Close()
		}()
		return mine, nil
	})
	if !ok {
		t.Fatal("the client did not take exec streams from a health that offers them")
	}
	s.c = c
	return s
}

// checkNoAnswer checks that a start failed with ErrNoAnswer, a code the control plane maps,
// and within the bound plus a margin.
func checkNoAnswer(t *testing.T, err error, took, bound time.Duration) {
	t.Helper()
	var pe *proto.Error
	if !errors.Is(err, client.ErrNoAnswer) || !errors.As(err, &pe) || pe.Code != proto.ErrCodeUnavailable {
		t.Fatalf("got %v, want ErrNoAnswer with code %s", err, proto.ErrCodeUnavailable)
	}
	if errors.Is(err, client.ErrClosed) {
		t.Errorf("got %v: a start without an answer must not read as a broken attach (it would be sent again)", err)
	}
	if took < bound || took > bound+5*time.Second {
		t.Errorf("the start failed after %v, want about %v", took, bound)
	}
}

// TestStartWithoutAnswer: a start that the init takes and never answers fails after the bound,
// over HTTP/2 and over an exec stream, instead of holding its caller (whose context, the
// service's own, never ends) forever. The stream is closed, not kept for the next call.
func TestStartWithoutAnswer(t *testing.T) {
	const bound = 300 * time.Millisecond
	client.SetStartAnswerTimeout(t, bound)
	s := newSilentInit(t)

	// No stream is ready yet: the first start goes over HTTP/2 (and one is dialled meanwhile).
	t0 := time.Now()
	_, err := s.c.StartLog(context.Background(), proto.ExecRequest{ID: "silent-1", Argv: []string{"true"}})
	checkNoAnswer(t, err, time.Since(t0), bound)
	if s.httpStarts.Load() != 1 {
		t.Fatalf("got %d starts over HTTP/2, want 1", s.httpStarts.Load())
	}
	waitFor(t, "the HTTP/2 request cancelled", func() bool { return s.httpGaveUp.Load() == 1 })
	waitFor(t, "a stream dialled", func() bool { return s.streams.Load() == 1 })

	t0 = time.Now()
	_, err = s.c.StartLog(context.Background(), proto.ExecRequest{ID: "silent-2", Argv: []string{"true"}})
	checkNoAnswer(t, err, time.Since(t0), bound)
	if s.httpStarts.Load() != 1 {
		t.Errorf("got %d starts over HTTP/2, want the second one on the stream only", s.httpStarts.Load())
	}
	waitFor(t, "the stream closed", func() bool { return s.streamsClosed.Load() == 1 })
	if s.streamReads.Load() <= int64(len(proto.StreamHello)) {
		t.Errorf("the stream carried %d bytes, want the hello and the call", s.streamReads.Load())
	}

	// The caller's own context still ends a start first.
	ctx, cancel := context.WithTimeout(context.Background(), bound/3)
	defer cancel()
	_, err = s.c.StartLog(ctx, proto.ExecRequest{ID: "silent-3", Argv: []string{"true"}})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrNoAnswer) {
		t.Errorf("got %v, want the caller's deadline", err)
	}
}

// TestStartBoundIsOnlyTheAnswer: the bound covers the wait for the answer, not the log after
// it. Commands that run past it are read to their end, over HTTP/2 and over exec streams, and
// the streams are kept for the next call.
func TestStartBoundIsOnlyTheAnswer(t *testing.T) {
	const bound = 200 * time.Millisecond
	client.SetStartAnswerTimeout(t, bound)
	for _, streams := range []bool{false, true} {
		name := "http2"
		if streams {
			name = "streams"
		}
		t.Run(name, func(t *testing.T) {
			h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
			var st *guesttest.Streams
			if streams {
				st = h.UseExecStreams(t)
			}
			for i := range 3 {
				req := proto.ExecRequest{ID: fmt.Sprintf("long-%s-%d", name, i), Argv: []string{"sh", "-c", "echo one; sleep 0.6; echo two"}}
				res, err := h.C.Run(guesttest.Ctx(t, 20*time.Second), req, 0, 0)
				if err != nil {
					t.Fatalf("run %d: %v", i, err)
				}
				if string(res.Stdout) != "one\ntwo\n" || res.Exit.ExitCode != 0 {
					t.Fatalf("run %d: got %q exit %d, want the whole output and 0", i, res.Stdout, res.Exit.ExitCode)
				}
			}
			if streams && st.Dials() > 2 {
				t.Errorf("got %d streams dialled for 3 calls in a row, want them kept", st.Dials())
			}
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
