package server_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

// waitOutput waits until the exec's stdout so far contains want, and returns it.
func waitOutput(t testing.TB, c *client.Client, id, want string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var out []byte
		for _, r := range guesttest.Records(t, c, id, 0, false) {
			if r.Kind == proto.RecordStdout {
				out = append(out, r.Data...)
			}
		}
		if strings.Contains(string(out), want) {
			return string(out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("output of %s: got %q, want it to contain %q", id, out, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startTty(t testing.TB, c *client.Client, id string, rows, cols int, argv ...string) proto.ExecInfo {
	t.Helper()
	info, err := c.StartExec(guesttest.Ctx(t, 10*time.Second), proto.ExecRequest{
		ID: id, Argv: argv, Tty: &proto.TtySize{Rows: rows, Cols: cols}, Env: []string{"PS1=$ ", "TERM=xterm"},
	})
	if err != nil {
		t.Fatalf("StartExec %s: %v", id, err)
	}
	return info
}

// TestTtyShell: an interactive shell under a terminal sees its size, answers what is typed and
// sees the new size after a resize.
func TestTtyShell(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		info := startTty(t, h.C, "bash", 24, 80, "bash", "--norc", "--noprofile", "-i")
		if !info.StdinOpen || info.Tty == nil || *info.Tty != (proto.TtySize{Rows: 24, Cols: 80}) {
			t.Fatalf("started: got stdin_open=%v tty=%v, want open, 24x80", info.StdinOpen, info.Tty)
		}
		writeAll(t, h.C, "bash", []byte("stty size; echo $((6*7)); [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-terminal\n"), 1<<10, false)
		waitOutput(t, h.C, "bash", "all-terminal\r\n")
		out := waitOutput(t, h.C, "bash", "24 80\r\n42\r\n")
		info, err := h.C.Resize(ctx, "bash", proto.TtySize{Rows: 50, Cols: 132})
		if err != nil {
			t.Fatalf("Resize: %v", err)
		}
		if info.Tty == nil || *info.Tty != (proto.TtySize{Rows: 50, Cols: 132}) || !info.Running {
			t.Fatalf("Resize: got %+v, want running at 50x132", info)
		}
		writeAll(t, h.C, "bash", []byte("stty size\nexit 3\n"), 1<<10, false)
		rest, st := output(t, h.C, "bash")
		if !strings.Contains(string(rest[len(out):]), "50 132\r\n") {
			t.Errorf("after resize: got %q, want 50 132", rest[len(out):])
		}
		if st.ExitCode != 3 || st.StdoutBytes != int64(len(rest)) || st.StderrBytes != 0 {
			t.Errorf("exit: got %+v, want code 3 with stdout_bytes %d (terminal output), stderr_bytes 0", st, len(rest))
		}
		info = execInfo(t, h.C, "bash")
		if info.StdinOpen || info.Tty == nil || *info.Tty != (proto.TtySize{Rows: 50, Cols: 132}) {
			t.Errorf("ended: got stdin_open=%v tty=%v, want closed, last size 50x132", info.StdinOpen, info.Tty)
		}
		guesttest.WaitTreeGone(t, "bash")
	})
}

func TestTtyErrors(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	for _, size := range []proto.TtySize{{Rows: 0, Cols: 80}, {Rows: 24, Cols: 0}, {Rows: -1, Cols: 80}, {Rows: 24, Cols: proto.MaxTtyCells + 1}, {Rows: 1 << 16, Cols: 80}} {
		_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "bad-size", Argv: []string{"true"}, Tty: &size})
		wantCode(t, err, proto.ErrCodeInvalid)
	}
	startTty(t, h.C, "tty", 24, 80, "sleep", "100")
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "pipes", Argv: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	startTty(t, h.C, "ended", 24, 80, "true")
	output(t, h.C, "ended")
	for _, size := range []proto.TtySize{{Rows: proto.MinTtyCells, Cols: proto.MinTtyCells}, {Rows: proto.MaxTtyCells, Cols: proto.MaxTtyCells}} {
		if info, err := h.C.Resize(ctx, "tty", size); err != nil || *info.Tty != size {
			t.Errorf("Resize to %v: got %v %v, want it", size, info.Tty, err)
		}
	}
	tests := []struct {
		name string
		id   string
		size proto.TtySize
		code string
	}{
		{"unknown-exec", "nope", proto.TtySize{Rows: 24, Cols: 80}, proto.ErrCodeNotFound},
		{"no-terminal", "pipes", proto.TtySize{Rows: 24, Cols: 80}, proto.ErrCodeState},
		{"ended", "ended", proto.TtySize{Rows: 24, Cols: 80}, proto.ErrCodeState},
		{"zero", "tty", proto.TtySize{}, proto.ErrCodeInvalid},
		{"too-wide", "tty", proto.TtySize{Rows: 24, Cols: proto.MaxTtyCells + 1}, proto.ErrCodeInvalid},
		{"uint16-wrap", "tty", proto.TtySize{Rows: 65536 + 24, Cols: 80}, proto.ErrCodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.C.Resize(ctx, tt.id, tt.size)
			wantCode(t, err, tt.code)
		})
	}
	if info := execInfo(t, h.C, "tty"); *info.Tty != (proto.TtySize{Rows: proto.MaxTtyCells, Cols: proto.MaxTtyCells}) {
		t.Errorf("after refused resizes: got %v, want the last accepted size", info.Tty)
	}
	_, err := h.C.WriteStdin(ctx, "ended", []byte("x"), false)
	wantCode(t, err, proto.ErrCodeState)
	for _, id := range []string{"tty", "pipes"} {
		if err := h.C.Signal(ctx, id, "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		output(t, h.C, id)
	}
}

// TestTtySigwinch: a resize gives the foreground process group SIGWINCH; a storm of concurrent
// resizes leaves the last one in force.
func TestTtySigwinch(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	startTty(t, h.C, "winch", 24, 80, "sh", "-c", `trap 'echo "winch $(stty size)"' WINCH; echo ready; while :; do sleep 0.02; done`)
	waitOutput(t, h.C, "winch", "ready")
	if _, err := h.C.Resize(ctx, "winch", proto.TtySize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, h.C, "winch", "winch 30 100")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := h.C.Resize(ctx, "winch", proto.TtySize{Rows: 1 + (g*50+i)%200, Cols: 1 + i}); err != nil {
					t.Errorf("Resize: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := h.C.Resize(ctx, "winch", proto.TtySize{Rows: 33, Cols: 99}); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, h.C, "winch", "winch 33 99")
	if info := execInfo(t, h.C, "winch"); *info.Tty != (proto.TtySize{Rows: 33, Cols: 99}) || !info.Running {
		t.Errorf("after the storm: got %+v, want running at 33x99", info)
	}
	if err := h.C.Signal(ctx, "winch", "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	output(t, h.C, "winch")
}

// TestTtyCloseStdin: closing a terminal's stdin types its end-of-file character in canonical
// mode (twice after an open line), nothing in raw mode; no bytes are taken afterwards.
func TestTtyCloseStdin(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	for _, typed := range []string{"hello\n", "open line", ""} {
		id := fmt.Sprintf("cat-%d", len(typed))
		startTty(t, h.C, id, 24, 80, "cat")
		writeAll(t, h.C, id, []byte(typed), 1<<10, true)
		if info := execInfo(t, h.C, id); info.StdinOpen {
			t.Errorf("%s: after close got stdin_open true, want false", id)
		}
		_, err := h.C.WriteStdin(ctx, id, []byte("more"), false)
		wantCode(t, err, proto.ErrCodeState)
		out, st := output(t, h.C, id)
		if st.ExitCode != 0 || !strings.Contains(string(out), strings.TrimSuffix(typed, "\n")) {
			t.Errorf("%s: got %q exit %d, want cat to end at EOF with %q", id, out, st.ExitCode, typed)
		}
	}
	// Raw mode: a close types nothing, so dd still waits for its fifth byte.
	startTty(t, h.C, "raw", 24, 80, "sh", "-c", "stty raw -echo; echo ready; dd bs=1 count=5 2>/dev/null | od -An -c; echo done")
	waitOutput(t, h.C, "raw", "ready")
	writeAll(t, h.C, "raw", []byte("abcd"), 1<<10, true)
	time.Sleep(300 * time.Millisecond)
	if info := execInfo(t, h.C, "raw"); !info.Running || info.StdinOpen {
		t.Errorf("raw: got %+v, want running (no byte typed by the close), stdin closed", info)
	}
	if err := h.C.Signal(ctx, "raw", "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	output(t, h.C, "raw")
}

// TestTtyLeaderExit: a Tty exec ends when its session leader exits, even while a child that
// ignores SIGHUP (inherited: ignored before the fork, so the hangup at the leader's exit cannot
// come first) holds the terminal; the terminal is hung up for it afterwards, and a signal to
// the ended exec still reaches it.
func TestTtyLeaderExit(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 30*time.Second)
		rc := filepath.Join(h.WS, "rc")
		id := fmt.Sprintf("leader-%v", opts.Reap)
		start := time.Now()
		startTty(t, h.C, id, 24, 80, "sh", "-c", `trap "" HUP; (sleep 2.5; echo late; echo $? > rc; exec sleep 100) & echo started`)
		out, st := output(t, h.C, id)
		if d := time.Since(start); d > 2300*time.Millisecond {
			t.Errorf("the exec ended after %v, want about a second after its leader", d)
		}
		if st.ExitCode != 0 || string(out) != "started\r\n" {
			t.Errorf("got %q %+v, want started and exit 0", out, st)
		}
		waitFor(t, func() bool { b, err := os.ReadFile(rc); return err == nil && len(b) > 0 })
		if b, _ := os.ReadFile(rc); strings.TrimSpace(string(b)) == "0" {
			t.Errorf("the leftover's write to the terminal after the exec ended: got status 0, want it failed (hung up)")
		}
		// The leftover writes rc and then execs sleep: while its execve replaces its memory its
		// environ cannot be read, so it is looked for again for a moment before it counts as gone.
		var left []int
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if left = guesttest.TreeLeft(id); len(left) == 1 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) != 1 {
			t.Fatalf("leftover: got %v, want the one sleep", left)
		}
		if err := h.C.Signal(ctx, id, "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		guesttest.WaitTreeGone(t, id)
	})
}

// TestTtyTimeoutAndSignals: the timeout kills a Tty exec's whole tree; an interactive shell
// ignores SIGTERM, as at a keyboard, and ends on SIGHUP.
func TestTtyTimeoutAndSignals(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 30*time.Second)
		id := fmt.Sprintf("timeout-%v", opts.Reap)
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", "setsid sleep 100 & sleep 100 & sleep 100"},
			Tty: &proto.TtySize{Rows: 24, Cols: 80}, TimeoutMs: 300}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Exit.TimedOut || res.Exit.ExitCode != 137 {
			t.Errorf("exit: got %+v, want timed out, 137", res.Exit)
		}
		guesttest.WaitTreeGone(t, id)

		id = fmt.Sprintf("bash-%v", opts.Reap)
		startTty(t, h.C, id, 24, 80, "bash", "--norc", "--noprofile", "-i")
		// The shell's own output, which the terminal's echo of the typed line ("echo u''p")
		// does not contain: that echo comes before the shell has even started (and set itself
		// up to ignore SIGTERM).
		writeAll(t, h.C, id, []byte("echo u''p\n"), 100, false)
		waitOutput(t, h.C, id, "up\r\n")
		if err := h.C.Signal(ctx, id, "SIGTERM"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if !execInfo(t, h.C, id).Running {
			t.Fatal("an interactive shell after SIGTERM: got ended, want running")
		}
		if err := h.C.Signal(ctx, id, "SIGHUP"); err != nil {
			t.Fatal(err)
		}
		if _, st := output(t, h.C, id); st.ExitCode != 129 || st.Signal != "SIGHUP" {
			t.Errorf("after SIGHUP: got %+v, want 129 SIGHUP", st)
		}
		guesttest.WaitTreeGone(t, id)
	})
}

// TestTtyFlood: a command that floods its terminal is logged within the log's bound, every
// byte counted, and it does not hold up other calls.
func TestTtyFlood(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 60*time.Second)
	// 2,500,000 lines of "y\n", which the terminal writes as "y\r\n".
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "flood", Argv: []string{"sh", "-c", "yes | head -c 5000000"},
		Tty: &proto.TtySize{Rows: 24, Cols: 80}, MaxLogBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		start := time.Now()
		if _, err := h.C.Health(ctx); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Health during the flood took %v", d)
		}
	}
	_, st := output(t, h.C, "flood")
	if st.ExitCode != 0 || st.StdoutBytes != 7500000 || st.DroppedBytes == 0 {
		t.Errorf("got %+v, want exit 0, stdout_bytes 7500000, some dropped", st)
	}
	var kept int64
	for _, r := range guesttest.Records(t, h.C, "flood", 0, false) {
		if r.Kind == proto.RecordStdout {
			kept += proto.RecordHeaderLen + int64(len(r.Data))
		}
	}
	if kept == 0 || kept > 1<<20 {
		t.Errorf("log bytes kept: got %d, want some, ≤ 1 MiB", kept)
	}
}

// TestTtyRawBinary: a command that puts its terminal in raw mode gets 1 MiB of binary input
// unchanged, in bounded writes.
func TestTtyRawBinary(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	startTty(t, h.C, "raw", 24, 80, "sh", "-c", "stty raw -echo -iexten; echo ready; head -c 1048576 | sha256sum")
	waitOutput(t, h.C, "raw", "ready")
	writeAll(t, h.C, "raw", data, 128<<10, false)
	out, st := output(t, h.C, "raw")
	if st.ExitCode != 0 || !strings.Contains(string(out), hex.EncodeToString(sum[:])) {
		t.Errorf("got %q exit %d, want the sha256 of the input %x", out, st.ExitCode, sum)
	}
}

// ttyHostile is a command that does to its terminal what a hostile one may: raw mode without
// echo, TIOCSTI of bytes into its own input, escape sequences; then it reads its input up to
// a 'q' and tells how many bytes came before it.
func ttyHostile() int {
	tio, err := unix.IoctlGetTermios(0, unix.TCGETS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcgets:", err)
		return 2
	}
	raw := *tio
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(0, unix.TCSETS, &raw); err != nil {
		fmt.Fprintln(os.Stderr, "tcsets:", err)
		return 2
	}
	var sti error
	for _, b := range []byte("sti") {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&b))); e != 0 {
			sti = e
			break
		}
	}
	fmt.Printf("tiocsti: %v\n\x1b[2J\x1b[?1049h\x1b]0;title\x07ready\n", sti)
	n, buf := 0, make([]byte, 1)
	for {
		if k, err := os.Stdin.Read(buf); err != nil || k == 0 {
			fmt.Printf("read error %v after %d\n", err, n)
			return 3
		}
		if buf[0] == 'q' {
			break
		}
		n++
	}
	fmt.Printf("read %d\n", n)
	return 7
}

func TestTtyHostileCommand(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	argv, env := helperCommand(t, "tty-hostile")
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "hostile", Argv: argv, Env: env, Tty: &proto.TtySize{Rows: 24, Cols: 80}}); err != nil {
		t.Fatal(err)
	}
	out := waitOutput(t, h.C, "hostile", "ready\n")
	writeAll(t, h.C, "hostile", []byte("hello\x03\x1a\x13q"), 100, false)
	rest, st := output(t, h.C, "hostile")
	// What TIOCSTI pushed (where the kernel lets it) is the command's own input, before ours.
	want := "read 8\n"
	if strings.Contains(out, "tiocsti: <nil>") {
		want = "read 11\n"
	}
	if st.ExitCode != 7 || !bytes.HasSuffix(rest, []byte(want)) {
		t.Errorf("got %q exit %d, want it to end with %q and exit 7", rest, st.ExitCode, want)
	}
	t.Logf("%s", strings.SplitN(out, "\n", 2)[0])
}

// TestTtyMasterNotInherited: no other exec, nor the command itself, holds a terminal's master;
// the server keeps none once the exec ended.
func TestTtyMasterNotInherited(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	masters := func() int {
		n := 0
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "/dev/ptmx" || strings.HasPrefix(l, "/dev/pts/ptmx") {
				n++
			}
		}
		return n
	}
	before := masters()
	startTty(t, h.C, "holder", 24, 80, "sh", "-c", "ls -l /proc/$$/fd; echo listed; sleep 100")
	own := waitOutput(t, h.C, "holder", "listed")
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "other", Argv: []string{"sh", "-c", "ls -l /proc/$$/fd"}}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, listing := range map[string]string{"the command": own, "another exec": string(res.Stdout)} {
		if strings.Contains(listing, "ptmx") {
			t.Errorf("%s holds a terminal master: %s", name, listing)
		}
	}
	if strings.Contains(string(res.Stdout), "/dev/pts") {
		t.Errorf("another exec holds the terminal: %s", res.Stdout)
	}
	if got := masters(); got != before+1 {
		t.Errorf("masters open in the server while the exec runs: got %d, want %d", got, before+1)
	}
	if err := h.C.Signal(ctx, "holder", "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	output(t, h.C, "holder")
	if got := masters(); got != before {
		t.Errorf("masters open in the server after the exec ended: got %d, want %d", got, before)
	}
}
