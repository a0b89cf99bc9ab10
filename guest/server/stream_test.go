package server_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// TestExecStreamRuns: once a stream is ready, commands start over it, one after the other on
// the same stream, with their output, exit codes and errors as over HTTP/2; a refused call
// leaves the stream usable.
func TestExecStreamRuns(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	streams := h.UseExecStreams(t)
	ctx := guesttest.Ctx(t, 30*time.Second)

	// The first call finds no stream ready and goes over HTTP/2; one is opened meanwhile.
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "first", Argv: []string{"true"}}, 0, 0)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("first: %+v %v", res.Exit, err)
	}
	waitFor(t, func() bool { return streams.Dials() == 1 })
	for i := range 5 {
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: fmt.Sprintf("s-%d", i),
			Argv: []string{"sh", "-c", fmt.Sprintf("echo out %d; echo err %d >&2; exit %d", i, i, i)}}, 0, 0)
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if string(res.Stdout) != fmt.Sprintf("out %d\n", i) || string(res.Stderr) != fmt.Sprintf("err %d\n", i) || res.Exit.ExitCode != i {
			t.Fatalf("run %d: stdout %q stderr %q exit %+v", i, res.Stdout, res.Stderr, res.Exit)
		}
	}
	// Refused calls answer the guest's error and keep the stream.
	_, err = h.C.Run(ctx, proto.ExecRequest{ID: "s-0", Argv: []string{"true"}}, 0, 0)
	wantCode(t, err, proto.ErrCodeExists)
	_, err = h.C.Run(ctx, proto.ExecRequest{ID: "bad id!", Argv: []string{"true"}}, 0, 0)
	wantCode(t, err, proto.ErrCodeInvalid)
	res, err = h.C.Run(ctx, proto.ExecRequest{ID: "last", Argv: []string{"sh", "-c", "head -c 300000 /dev/zero"}}, 0, 0)
	if err != nil || len(res.Stdout) != 300000 || res.Exit.ExitCode != 0 {
		t.Fatalf("last: %d bytes, %+v %v", len(res.Stdout), res.Exit, err)
	}
	if n := streams.Dials(); n != 1 {
		t.Fatalf("%d streams dialled for one command at a time, want 1", n)
	}
	if streams.Read() < 300000 {
		t.Fatalf("the streams carried %d bytes: the commands did not go over them", streams.Read())
	}
}

// TestExecStreamWire speaks the stream's bytes as a hostile or broken host might: an oversized
// request is refused and the stream closed; a request that is not JSON is refused and the
// stream goes on; a host that hangs up mid-call leaves the command running.
func TestExecStreamWire(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)

	c, br := rawStream(t, h)
	var big [4]byte
	binary.BigEndian.PutUint32(big[:], proto.MaxStreamRequest+1)
	if _, err := c.Write(big[:]); err != nil {
		t.Fatal(err)
	}
	if code := readRefusal(t, br); code != proto.ErrCodeTooLarge {
		t.Fatalf("oversized request: got %s, want %s", code, proto.ErrCodeTooLarge)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after an oversized request: got %v, want the stream closed", err)
	}

	c, br = rawStream(t, h)
	writeCall(t, c, []byte("{not json"))
	if code := readRefusal(t, br); code != proto.ErrCodeInvalid {
		t.Fatalf("bad JSON: got %s, want %s", code, proto.ErrCodeInvalid)
	}
	call(t, c, proto.ExecRequest{ID: "after-bad", Argv: []string{"echo", "still here"}})
	if out := readStarted(t, br); out != "still here\n" {
		t.Fatalf("after a refusal: got %q", out)
	}

	// Hang up while the command runs: it runs on, and the init lets the stream go.
	call(t, c, proto.ExecRequest{ID: "orphan", Argv: []string{"sleep", "30"}})
	var ans [proto.StreamAnswerLen]byte
	if _, err := io.ReadFull(br, ans[:]); err != nil || ans[0] != proto.StreamStarted {
		t.Fatalf("answer: %v %x", err, ans)
	}
	c.Close()
	time.Sleep(100 * time.Millisecond)
	info, err := h.C.Exec(ctx, "orphan")
	if err != nil || !info.Running {
		t.Fatalf("after the host hung up: %+v %v, want the command running", info, err)
	}
	if err := h.C.Signal(ctx, "orphan", "KILL"); err != nil {
		t.Fatal(err)
	}
}

// TestExecStreamQuiesce: a pause's quiesce closes every exec stream, one carrying a call
// included; the command runs on and its log is read over HTTP/2.
func TestExecStreamQuiesce(t *testing.T) {
	h := guesttest.New(t, server.Options{Quiesce: func() (bool, error) { return true, nil }}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	c, br := rawStream(t, h)
	call(t, c, proto.ExecRequest{ID: "across", Argv: []string{"sh", "-c", "echo before; sleep 1; echo after"}})
	var ans [proto.StreamAnswerLen]byte
	if _, err := io.ReadFull(br, ans[:]); err != nil || ans[0] != proto.StreamStarted {
		t.Fatalf("answer: %v %x", err, ans)
	}
	idle, idleBr := rawStream(t, h)
	defer idle.Close()
	// Both streams are the server's before the quiesce (the idle one's hello may still be on
	// its way: a connection the server has not taken yet is not the quiesce's to close).
	waitFor(t, func() bool { return h.Srv.OpenStreams() == 2 })
	// A connection the server took whose hello comes only after the quiesce.
	late, lateEnd := guesttest.Socketpair(t)
	defer lateEnd.Close()
	conns := h.Srv.OpenConns()
	go h.Srv.ServeConn(late)
	waitFor(t, func() bool { return h.Srv.OpenConns() == conns+1 })
	if _, err := h.C.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(lateEnd, proto.StreamHello); err != nil {
		t.Fatal(err)
	}
	_ = lateEnd.SetDeadline(time.Now().Add(10 * time.Second))
	lateBr := bufio.NewReader(lateEnd)
	for name, r := range map[string]*bufio.Reader{"busy": br, "idle": idleBr, "late": lateBr} {
		if _, err := io.Copy(io.Discard, r); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("%s stream: %v", name, err)
		}
	}
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "after-quiesce", Argv: []string{"true"}}, 0, 0)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("HTTP/2 after the quiesce: %+v %v", res.Exit, err)
	}
	lr, err := h.C.Log(ctx, "across", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	var out strings.Builder
	for {
		rec, err := lr.Next()
		if err != nil {
			t.Fatalf("log: %v (read %q)", err, out.String())
		}
		if rec.Kind == proto.RecordExit {
			break
		}
		out.Write(rec.Data)
	}
	if out.String() != "before\nafter\n" {
		t.Fatalf("log across the quiesce: %q", out.String())
	}
}

// rawStream is a new exec stream to h's server, its hello sent.
func rawStream(t *testing.T, h *guesttest.Harness) (net.Conn, *bufio.Reader) {
	t.Helper()
	serverEnd, c := guesttest.Socketpair(t)
	go h.Srv.ServeConn(serverEnd)
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, proto.StreamHello); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c, bufio.NewReader(c)
}

func writeCall(t *testing.T, c net.Conn, body []byte) {
	t.Helper()
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	if _, err := c.Write(append(msg, body...)); err != nil {
		t.Fatal(err)
	}
}

func call(t *testing.T, c net.Conn, req proto.ExecRequest) {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	writeCall(t, c, b)
}

// readRefusal reads a StreamRefused answer and returns its code.
func readRefusal(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var ans [proto.StreamAnswerLen]byte
	if _, err := io.ReadFull(br, ans[:]); err != nil {
		t.Fatal(err)
	}
	if ans[0] != proto.StreamRefused {
		t.Fatalf("answer %#x, want a refusal", ans[0])
	}
	b := make([]byte, binary.BigEndian.Uint32(ans[1:]))
	if _, err := io.ReadFull(br, b); err != nil {
		t.Fatal(err)
	}
	var e proto.Error
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("refusal %q: %v", b, err)
	}
	return e.Code
}

// readStarted reads a StreamStarted answer and the log to its exit record, and returns the
// output.
func readStarted(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var ans [proto.StreamAnswerLen]byte
	if _, err := io.ReadFull(br, ans[:]); err != nil {
		t.Fatal(err)
	}
	if ans[0] != proto.StreamStarted || binary.BigEndian.Uint32(ans[1:]) != 0 {
		t.Fatalf("answer %x, want started", ans)
	}
	var out strings.Builder
	for {
		var hdr [proto.RecordHeaderLen]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("log: %v", err)
		}
		data := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, data); err != nil {
			t.Fatalf("log: %v", err)
		}
		if hdr[0] == proto.RecordExit {
			return out.String()
		}
		out.Write(data)
	}
}

// TestExecStreamBrokenFallsBack: a kept stream that breaks before the answer (the init closed
// it, or it broke after the command started) costs nothing: the call is made again over HTTP/2
// and a command that did start is followed from its log, its output once.
func TestExecStreamBrokenFallsBack(t *testing.T) {
	h := guesttest.New(t, server.Options{Quiesce: func() (bool, error) { return true, nil }}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	var dials atomic.Int64
	// serverReads counts, per dial, the server's reads of its end: a second read means the
	// server took the stream's hello and serves it as an exec stream (a quiesce closes it).
	var mu sync.Mutex
	var serverReads []*atomic.Int64
	served := func(dial int) bool {
		mu.Lock()
		defer mu.Unlock()
		return len(serverReads) >= dial && serverReads[dial-1].Load() >= 2
	}
	dropAnswer := atomic.Bool{}
	ok := h.C.UseExecStreams(func(ctx context.Context) (io.ReadWriteCloser, error) {
		dials.Add(1)
		serverEnd, clientEnd := guesttest.Socketpair(t)
		reads := new(atomic.Int64)
		mu.Lock()
		serverReads = append(serverReads, reads)
		mu.Unlock()
		go h.Srv.ServeConn(&readCounter{Conn: serverEnd, reads: reads})
		return &answerDropper{Conn: clientEnd, drop: &dropAnswer}, nil
	})
	if !ok {
		t.Fatal("no exec streams")
	}
	run := func(id, want string) {
		t.Helper()
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", "echo " + want}}, 0, 0)
		if err != nil || string(res.Stdout) != want+"\n" || res.Exit.ExitCode != 0 {
			t.Fatalf("%s: %q %+v %v", id, res.Stdout, res.Exit, err)
		}
	}
	run("warm", "warm")
	waitFor(t, func() bool { return dials.Load() == 1 })

	// The stream breaks after the command started, before its answer was read.
	dropAnswer.Store(true)
	run("started-then-broken", "once")
	if dropAnswer.Load() {
		t.Fatal("the call did not go over the stream")
	}

	// The init closes the kept stream (a quiesce) without this end noticing. (Once the init
	// serves it: a quiesce before that would miss it, and the call would go over it.)
	waitFor(t, func() bool { return dials.Load() == 2 && served(2) })
	if _, err := h.C.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	run("stale", "stale")
	// It was taken, found broken and replaced.
	waitFor(t, func() bool { return dials.Load() == 3 })
}

// readCounter counts the reads of a connection.
type readCounter struct {
	net.Conn
	reads *atomic.Int64
}

func (c *readCounter) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// answerDropper is a stream that, once drop is set, breaks at its next read: the call's
// request went out, its answer is lost.
type answerDropper struct {
	net.Conn
	drop *atomic.Bool
}

func (c *answerDropper) Read(p []byte) (int, error) {
	if c.drop.CompareAndSwap(true, false) {
		time.Sleep(50 * time.Millisecond) // the init started the command meanwhile
		c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return c.Conn.Read(p)
}

// TestExecStreamCap: commands that run on hold their streams, and past the client's bound the
// others go over HTTP/2; every one of them is followed to its end.
func TestExecStreamCap(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	streams := h.UseExecStreams(t)
	ctx := guesttest.Ctx(t, 30*time.Second)
	var readers []*client.LogReader
	for i := range 20 {
		lr, err := h.C.StartLog(ctx, proto.ExecRequest{ID: fmt.Sprintf("long-%d", i), Argv: []string{"sleep", "30"}})
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		readers = append(readers, lr)
		time.Sleep(20 * time.Millisecond) // a background dial lands
	}
	if n := streams.Dials(); n < 2 || n > 8 {
		t.Fatalf("%d streams for 20 commands in flight, want 2..8", n)
	}
	for i, lr := range readers {
		if err := h.C.Signal(ctx, fmt.Sprintf("long-%d", i), "KILL"); err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := lr.Next()
			if err != nil {
				t.Fatalf("log %d: %v", i, err)
			}
			if rec.Kind == proto.RecordExit {
				if st, err := rec.ExitStatus(); err != nil || st.Signal != "SIGKILL" {
					t.Fatalf("exit %d: %+v %v", i, st, err)
				}
				break
			}
		}
		if _, err := lr.Next(); err != io.EOF {
			t.Fatalf("after the exit record %d: %v, want io.EOF", i, err)
		}
		lr.Close()
	}
}
