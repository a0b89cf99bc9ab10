package runtimetest

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/proto"
	"sandboxd/runtime"
)

// testTerminal runs an interactive shell under a terminal in a box: what is typed reaches it,
// it sees the terminal's size and then the new one after a resize; a Tty exec ends with its
// session leader even while a child that ignores SIGHUP holds the terminal, and that child is
// still reached by a signal to the ended exec.
func testTerminal(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	id := CreateBox(t, d, spec)
	c := Client(t, d, id)
	ctx := ctxT(t)

	sh := NewExecID()
	info, err := c.StartExec(ctx, proto.ExecRequest{ID: sh, Argv: []string{"bash", "--norc", "--noprofile", "-i"},
		Env: []string{"PS1=$ ", "TERM=xterm"}, Tty: &proto.TtySize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatalf("StartExec under a terminal: %v", err)
	}
	if !info.StdinOpen || info.Tty == nil || *info.Tty != (proto.TtySize{Rows: 24, Cols: 80}) {
		t.Fatalf("started: got stdin_open=%v tty=%v, want open, 24x80", info.StdinOpen, info.Tty)
	}
	mustType(t, c, sh, "stty size; echo $((6*7))\n")
	out := awaitOutput(t, c, sh, "24 80\r\n42\r\n")
	info, err = c.Resize(ctx, sh, proto.TtySize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if info.Tty == nil || *info.Tty != (proto.TtySize{Rows: 40, Cols: 120}) {
		t.Fatalf("Resize: got tty %v, want 40x120", info.Tty)
	}
	mustType(t, c, sh, "stty size\n")
	if got := awaitOutput(t, c, sh, "40 120\r\n"); !strings.Contains(got[len(out):], "40 120") {
		t.Errorf("after the resize: got %q, want the new size", got[len(out):])
	}
	mustType(t, c, sh, "exit 5\n")
	if _, st := collect(t, c, sh); st.ExitCode != 5 {
		t.Errorf("exit: got %+v, want 5", st)
	}

	// A command that prints and exits ends its exec without waiting on the terminal: its
	// output is whole, and the end of output is seen at once (EIO from the master).
	quick := NewExecID()
	start := time.Now()
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: quick, Argv: []string{"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo"},
		Tty: &proto.TtySize{Rows: 24, Cols: 80}}); err != nil {
		t.Fatal(err)
	}
	got, st := collect(t, c, quick)
	if st.ExitCode != 0 || len(got) != 100002 || st.StdoutBytes != 100002 {
		t.Errorf("quick: got %d bytes (stdout_bytes %d), exit %d, want 100000 x and \\r\\n, exit 0", len(got), st.StdoutBytes, st.ExitCode)
	}
	t.Logf("a quick Tty exec took %v from start to its exit record", time.Since(start))

	// A command that sets its terminal raw gets binary input unchanged, and what it floods
	// the terminal with is counted to the byte (raw: no output processing, "\n" stays one).
	input := make([]byte, 1<<20)
	_, _ = crand.Read(input)
	sum := sha256.Sum256(input)
	raw := NewExecID()
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: raw, Argv: []string{"sh", "-c", "stty raw -echo -iexten; echo ready; head -c 1048576 | sha256sum; yes | head -c 2000000"},
		Tty: &proto.TtySize{Rows: 24, Cols: 80}}); err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, c, raw, "ready")
	start = time.Now()
	writeStdin(t, c, raw, input, 128<<10, false)
	got, st = collect(t, c, raw)
	t.Logf("1 MiB typed into a raw terminal and 2 MB out of it: %v", time.Since(start))
	if !strings.Contains(string(got), hex.EncodeToString(sum[:])) || st.ExitCode != 0 || st.StdoutBytes != int64(len("ready\n")+len(hex.EncodeToString(sum[:]))+len("  -\n")+2000000) {
		t.Errorf("raw: got exit %d, stdout_bytes %d, output starting %q, want the input's sha256 and every byte counted", st.ExitCode, st.StdoutBytes, got[:min(len(got), 100)])
	}

	// The leader exits; a child that ignores SIGHUP holds the terminal. The exec ends all the
	// same, and a signal to it ends the child.
	marker := fmt.Sprintf("%d.%06d", 500, rand.IntN(1000000))
	leader := NewExecID()
	start = time.Now()
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: leader, Argv: []string{"sh", "-c", `trap "" HUP; sleep ` + marker + ` & echo started`},
		Tty: &proto.TtySize{Rows: 24, Cols: 80}}); err != nil {
		t.Fatal(err)
	}
	if got, st := collect(t, c, leader); st.ExitCode != 0 || string(got) != "started\r\n" {
		t.Errorf("leader: got %q %+v, want started, exit 0", got, st)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the exec whose child holds the terminal took %v to end, want about a second", el)
	}
	if n := countProcs(t, c, "sleep "+marker); n != 1 {
		t.Fatalf("the child holding the terminal: got %d, want 1 running", n)
	}
	if err := c.Signal(ctx, leader, "SIGKILL"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for countProcs(t, c, "sleep "+marker) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the child holding the terminal survived a SIGKILL of its ended exec")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testStdin streams 3 MiB through an exec's open stdin in bounded writes, and checks that a
// command that never reads fills the buffer without holding anything else up.
func testStdin(t *testing.T, d runtime.Driver, spec runtime.BoxSpec) {
	id := CreateBox(t, d, spec)
	c := Client(t, d, id)
	ctx := ctxT(t)

	data := make([]byte, 3<<20)
	_, _ = crand.Read(data)
	sum := sha256.Sum256(data)
	ex := NewExecID()
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: ex, Argv: []string{"sh", "-c", "cat > stdin.bin && wc -c < stdin.bin && sha256sum < stdin.bin"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	writeStdin(t, c, ex, data, 256<<10, true)
	out, st := collect(t, c, ex)
	t.Logf("3 MiB through stdin in 256 KiB writes: %v", time.Since(start))
	want := fmt.Sprintf("%d\n%s  -\n", len(data), hex.EncodeToString(sum[:]))
	if st.ExitCode != 0 || string(out) != want {
		t.Errorf("got %q exit %d, want %q", out, st.ExitCode, want)
	}

	deaf := NewExecID()
	if _, err := c.StartExec(ctx, proto.ExecRequest{ID: deaf, Argv: []string{"sleep", "600"}, StdinOpen: true}); err != nil {
		t.Fatal(err)
	}
	full := false
	for i := 0; i < 64 && !full; i++ {
		_, err := c.WriteStdin(ctx, deaf, data[:256<<10], false)
		var ge *proto.Error
		switch {
		case errors.As(err, &ge) && ge.Code == proto.ErrCodeUnavailable:
			full = true
		case err != nil:
			t.Fatalf("WriteStdin: %v", err)
		}
	}
	if !full {
		t.Fatal("16 MiB into a command that never reads: got every write taken, want the buffer full")
	}
	if res := MustRun(t, c, proto.ExecRequest{Argv: []string{"echo", "served"}}); string(res.Stdout) != "served\n" {
		t.Errorf("another exec while the buffer is full: got %q", res.Stdout)
	}
	if err := c.Signal(ctx, deaf, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if _, st := collect(t, c, deaf); st.ExitCode != 137 {
		t.Errorf("the deaf command: got %+v, want 137", st)
	}
	_, err := c.WriteStdin(ctx, deaf, []byte("x"), false)
	var ge *proto.Error
	if !errors.As(err, &ge) || ge.Code != proto.ErrCodeState {
		t.Errorf("a write to an ended exec: got %v, want %s", err, proto.ErrCodeState)
	}
}

// writeStdin writes data to an exec's stdin in writes of at most chunk bytes, each retried
// while the buffer has no room for it; the last one closes stdin when closeAfter.
func writeStdin(t *testing.T, c *client.Client, id string, data []byte, chunk int, closeAfter bool) {
	t.Helper()
	for off := 0; off < len(data); {
		n := min(chunk, len(data)-off)
		_, err := c.WriteStdin(ctxT(t), id, data[off:off+n], closeAfter && off+n == len(data))
		var ge *proto.Error
		if errors.As(err, &ge) && ge.Code == proto.ErrCodeUnavailable {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("WriteStdin at %d: %v", off, err)
		}
		off += n
	}
}

// mustType writes s to an exec's stdin.
func mustType(t *testing.T, c *client.Client, id, s string) {
	t.Helper()
	if _, err := c.WriteStdin(ctxT(t), id, []byte(s), false); err != nil {
		t.Fatalf("WriteStdin(%q): %v", s, err)
	}
}

// awaitOutput follows an exec's log until its stdout holds want and returns the stdout so far.
func awaitOutput(t *testing.T, c *client.Client, id, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lr, err := c.Log(ctx, id, 0, true)
	if err != nil {
		t.Fatalf("Log: %v", err)
	}
	defer lr.Close()
	var out []byte
	for {
		rec, err := lr.Next()
		if err != nil {
			t.Fatalf("waiting for %q: got %q and then %v", want, out, err)
		}
		if rec.Kind == proto.RecordExit {
			t.Fatalf("waiting for %q: the exec ended with output %q", want, out)
		}
		if rec.Kind == proto.RecordStdout {
			out = append(out, rec.Data...)
			if strings.Contains(string(out), want) {
				return string(out)
			}
		}
	}
}

// collect follows an exec's log to its end and returns its stdout and exit status.
func collect(t *testing.T, c *client.Client, id string) ([]byte, proto.ExitStatus) {
	t.Helper()
	lr, err := c.Log(ctxT(t), id, 0, true)
	if err != nil {
		t.Fatalf("Log: %v", err)
	}
	defer lr.Close()
	var out []byte
	for {
		rec, err := lr.Next()
		if err == io.EOF {
			t.Fatalf("the log of %s ended without an exit record", id)
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		switch rec.Kind {
		case proto.RecordStdout:
			out = append(out, rec.Data...)
		case proto.RecordExit:
			st, err := rec.ExitStatus()
			if err != nil {
				t.Fatal(err)
			}
			return out, st
		}
	}
}

// countProcs counts the box's processes whose command line is args exactly.
func countProcs(t *testing.T, c *client.Client, args string) int {
	t.Helper()
	res := MustRun(t, c, proto.ExecRequest{Argv: []string{"ps", "-eo", "args="}})
	n := 0
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if strings.TrimSpace(line) == args {
			n++
		}
	}
	return n
}
