package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// writeAll writes data in writes of at most chunk bytes, retrying a write the buffer has no
// room for (ErrCodeUnavailable) until it fits; the last one closes stdin when closeAfter.
func writeAll(t testing.TB, c *client.Client, id string, data []byte, chunk int, closeAfter bool) {
	t.Helper()
	ctx := guesttest.Ctx(t, 60*time.Second)
	for first := true; first || len(data) > 0; first = false {
		n := min(chunk, len(data))
		last := n == len(data)
		for {
			res, err := c.WriteStdin(ctx, id, data[:n], closeAfter && last)
			var ge *proto.Error
			if errors.As(err, &ge) && ge.Code == proto.ErrCodeUnavailable {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("WriteStdin(%d bytes): %v", n, err)
			}
			if res.Written != int64(n) || res.Buffered < 0 || res.Buffered > proto.StdinBufferBytes+2 || res.Closed != (closeAfter && last) {
				t.Fatalf("WriteStdin(%d bytes): got %+v, want all written, closed=%v", n, res, closeAfter && last)
			}
			break
		}
		data = data[n:]
	}
}

// output follows an exec's log to its end and returns its stdout and exit status.
func output(t testing.TB, c *client.Client, id string) ([]byte, proto.ExitStatus) {
	t.Helper()
	var out []byte
	for _, r := range guesttest.Records(t, c, id, 0, true) {
		switch r.Kind {
		case proto.RecordStdout:
			out = append(out, r.Data...)
		case proto.RecordExit:
			st, err := r.ExitStatus()
			if err != nil {
				t.Fatal(err)
			}
			return out, st
		}
	}
	t.Fatalf("the log of %s ended without an exit record", id)
	return nil, proto.ExitStatus{}
}

func execInfo(t testing.TB, c *client.Client, id string) proto.ExecInfo {
	t.Helper()
	info, err := c.Exec(guesttest.Ctx(t, 10*time.Second), id)
	if err != nil {
		t.Fatalf("Exec(%s): %v", id, err)
	}
	return info
}

// TestStdinOpen: the bytes of every call reach the command in the order the calls were taken,
// after the request's own Stdin; close ends its input; stdin_open says whether calls are taken.
func TestStdinOpen(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		tests := []struct {
			name    string
			initial string
			writes  []string
			want    string
		}{
			{"writes", "", []string{"one ", "two ", "three"}, "one two three"},
			{"after-request-stdin", "first ", []string{"second ", "third"}, "first second third"},
			{"empty-writes", "", []string{"", "x", ""}, "x"},
			{"close-only", "", nil, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				id := "stdin-" + tt.name
				info, err := h.C.StartExec(ctx, proto.ExecRequest{ID: id, Argv: []string{"cat"}, Stdin: []byte(tt.initial), StdinOpen: true})
				if err != nil {
					t.Fatal(err)
				}
				if !info.StdinOpen || info.Tty != nil {
					t.Fatalf("started: got stdin_open=%v tty=%v, want open, no tty", info.StdinOpen, info.Tty)
				}
				for _, w := range tt.writes {
					res, err := h.C.WriteStdin(ctx, id, []byte(w), false)
					if err != nil || res.Written != int64(len(w)) || res.Closed {
						t.Fatalf("WriteStdin(%q): got %+v %v, want written, open", w, res, err)
					}
				}
				if !execInfo(t, h.C, id).StdinOpen {
					t.Fatal("before close: got stdin_open false, want true")
				}
				res, err := h.C.WriteStdin(ctx, id, nil, true)
				if err != nil || !res.Closed {
					t.Fatalf("close: got %+v %v, want closed", res, err)
				}
				if execInfo(t, h.C, id).StdinOpen {
					t.Error("after close: got stdin_open true, want false")
				}
				_, err = h.C.WriteStdin(ctx, id, []byte("late"), false)
				wantCode(t, err, proto.ErrCodeState)
				out, st := output(t, h.C, id)
				if string(out) != tt.want || st.ExitCode != 0 {
					t.Errorf("got %q exit %d, want %q exit 0", out, st.ExitCode, tt.want)
				}
				if info := execInfo(t, h.C, id); info.StdinOpen || info.Running {
					t.Errorf("ended: got %+v, want stdin closed", info)
				}
				_, err = h.C.WriteStdin(ctx, id, []byte("ended"), false)
				wantCode(t, err, proto.ErrCodeState)
			})
		}
	})
}

// TestStdinStream: 3 MiB of random bytes in bounded writes arrive whole and in order.
func TestStdinStream(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 60*time.Second)
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "stream", Argv: []string{"cat"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	writeAll(t, h.C, "stream", data, 200<<10, true)
	out, st := output(t, h.C, "stream")
	if st.ExitCode != 0 || !bytes.Equal(out, data) {
		t.Fatalf("got %d bytes (exit %d), want the %d bytes written, in order", len(out), st.ExitCode, len(data))
	}
	// The largest write the protocol takes, all at once, into an empty buffer.
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "max", Argv: []string{"wc", "-c"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	writeAll(t, h.C, "max", data[:proto.MaxStdinWrite], proto.MaxStdinWrite, true)
	out, _ = output(t, h.C, "max")
	if got := strings.TrimSpace(string(out)); got != fmt.Sprint(proto.MaxStdinWrite) {
		t.Errorf("wc -c: got %q, want %d", got, proto.MaxStdinWrite)
	}
}

func TestStdinErrors(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "closed-stdin", Argv: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "request-stdin", Argv: []string{"sh", "-c", "cat; sleep 100"}, Stdin: []byte("once")}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "open", Argv: []string{"cat"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		id    string
		data  []byte
		close bool
		code  string
	}{
		{"unknown-exec", "nope", []byte("x"), false, proto.ErrCodeNotFound},
		{"no-open-stdin", "closed-stdin", []byte("x"), false, proto.ErrCodeState},
		{"no-open-stdin-close", "closed-stdin", nil, true, proto.ErrCodeState},
		{"request-stdin-only", "request-stdin", []byte("x"), false, proto.ErrCodeState},
		{"too-large", "open", make([]byte, proto.MaxStdinWrite+1), false, proto.ErrCodeTooLarge},
		{"far-too-large", "open", make([]byte, 8<<20), true, proto.ErrCodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.C.WriteStdin(ctx, tt.id, tt.data, tt.close)
			wantCode(t, err, tt.code)
		})
	}
	for _, id := range []string{"closed-stdin", "request-stdin"} {
		if info := execInfo(t, h.C, id); info.StdinOpen {
			t.Errorf("%s: got stdin_open true, want false", id)
		}
	}
	// The refused writes left nothing behind, and did not close stdin.
	writeAll(t, h.C, "open", []byte("kept"), 10, true)
	if out, _ := output(t, h.C, "open"); string(out) != "kept" {
		t.Errorf("open: got %q, want only %q", out, "kept")
	}
	for _, id := range []string{"closed-stdin", "request-stdin"} {
		if err := h.C.Signal(ctx, id, "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		output(t, h.C, id)
	}
}

// TestStdinNeverRead: a command that never reads its stdin fills the buffer; later writes are
// refused at once, nothing else waits on it, and it ends and is cleaned up as usual.
func TestStdinNeverRead(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 30*time.Second)
		if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "deaf", Argv: []string{"sleep", "100"}, StdinOpen: true}); err != nil {
			t.Fatal(err)
		}
		block := make([]byte, 256<<10)
		var full bool
		for i := 0; i < 64 && !full; i++ {
			start := time.Now()
			_, err := h.C.WriteStdin(ctx, "deaf", block, false)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("write %d took %v, want no wait for the command", i, d)
			}
			var ge *proto.Error
			switch {
			case errors.As(err, &ge) && ge.Code == proto.ErrCodeUnavailable:
				full = true
			case err != nil:
				t.Fatalf("write %d: %v", i, err)
			}
		}
		if !full {
			t.Fatal("16 MiB into a command that never reads: got every write taken, want the buffer full")
		}
		if !execInfo(t, h.C, "deaf").StdinOpen {
			t.Error("full buffer: got stdin_open false, want true (retry later)")
		}
		// The server serves everything else meanwhile.
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "other", Argv: []string{"sh", "-c", "echo other"}}, 0, 0)
		if err != nil || string(res.Stdout) != "other\n" {
			t.Fatalf("another exec: got %q %v, want other", res.Stdout, err)
		}
		// Its end does not wait for the buffer.
		start := time.Now()
		if err := h.C.Signal(ctx, "deaf", "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		if _, st := output(t, h.C, "deaf"); st.ExitCode != 137 {
			t.Errorf("exit: got %+v, want 137", st)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("ending took %v, want it prompt", d)
		}
		_, err = h.C.WriteStdin(ctx, "deaf", []byte("x"), false)
		wantCode(t, err, proto.ErrCodeState)
		guesttest.WaitTreeGone(t, "deaf")
	})
}

// TestStdinClosedByCommand: a command that closes its stdin (EPIPE for the feed) makes later
// writes invalid_state, never a hang, while it runs on.
func TestStdinClosedByCommand(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "shut", Argv: []string{"sh", "-c", "exec 0<&-; echo shut; exec sleep 100"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return execInfo(t, h.C, "shut").LogBytes > 0 })
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := h.C.WriteStdin(ctx, "shut", []byte("into a closed pipe\n"), false)
		var ge *proto.Error
		if errors.As(err, &ge) && ge.Code == proto.ErrCodeState {
			break
		}
		if err != nil {
			t.Fatalf("WriteStdin: got %v, want taken or invalid_state", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("writes into a stdin the command closed: got them taken for 10s, want invalid_state")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if info := execInfo(t, h.C, "shut"); !info.Running || info.StdinOpen {
		t.Errorf("got %+v, want running with stdin closed", info)
	}
	if err := h.C.Signal(ctx, "shut", "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	output(t, h.C, "shut")
}

// TestStdinConcurrentCalls: calls from many goroutines are each taken whole: every call's bytes
// come out contiguous.
func TestStdinConcurrentCalls(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "many", Argv: []string{"cat"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 20
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range each {
				line := []byte(strings.Repeat(fmt.Sprintf("%c", 'a'+w), 4000+i) + "\n")
				for {
					_, err := h.C.WriteStdin(ctx, "many", line, false)
					var ge *proto.Error
					if errors.As(err, &ge) && ge.Code == proto.ErrCodeUnavailable {
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					break
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.C.WriteStdin(ctx, "many", nil, true); err != nil {
		t.Fatal(err)
	}
	out, _ := output(t, h.C, "many")
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != writers*each {
		t.Fatalf("got %d lines, want %d", len(lines), writers*each)
	}
	next := make(map[byte]int)
	for _, l := range lines {
		c := l[0]
		if strings.Trim(l, string(c)) != "" || len(l) != 4000+next[c] {
			t.Fatalf("line of %d bytes starting %q: got it mixed or out of order, want call %d of writer %c whole", len(l), l[:10], next[c], c)
		}
		next[c]++
	}
}
