package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestHealth(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverNetPipe)
	got, err := h.C.Health(guesttest.Ctx(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Health: %v", err)
	}
	if !got.OK || got.Pid != os.Getpid() || got.Version != server.Version {
		t.Fatalf("Health: got %+v, want ok, pid %d, version %s", got, os.Getpid(), server.Version)
	}
}

func TestExec(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		if err := os.WriteFile(filepath.Join(h.WS, "noexec.sh"), []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(h.WS, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name       string
			req        proto.ExecRequest
			wantCode   int
			wantSignal string
			wantOut    string
			wantErr    string // substring of stderr
			wantStatus string // substring of ExitStatus.Error
		}{
			{name: "true", req: proto.ExecRequest{Argv: []string{"true"}}},
			{name: "false", req: proto.ExecRequest{Argv: []string{"false"}}, wantCode: 1},
			{name: "out-err-code", req: proto.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}},
				wantCode: 3, wantOut: "out\n", wantErr: "err\n"},
			{name: "not-found", req: proto.ExecRequest{Argv: []string{"no-such-command-x"}},
				wantCode: 127, wantErr: "no-such-command-x: command not found", wantStatus: "command not found"},
			{name: "path-not-found", req: proto.ExecRequest{Argv: []string{"./missing"}},
				wantCode: 127, wantErr: "./missing: No such file or directory", wantStatus: "No such file"},
			{name: "not-executable", req: proto.ExecRequest{Argv: []string{"./noexec.sh"}},
				wantCode: 126, wantErr: "Permission denied", wantStatus: "Permission denied"},
			{name: "is-directory", req: proto.ExecRequest{Argv: []string{"./sub"}},
				wantCode: 126, wantErr: "Is a directory", wantStatus: "Is a directory"},
			{name: "bad-cwd", req: proto.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"},
				wantCode: 127, wantErr: "cd: /no/such/dir", wantStatus: "cd: /no/such/dir"},
			{name: "bad-cwd-relative-command", req: proto.ExecRequest{Argv: []string{"./missing"}, Cwd: "/no/such/dir"},
				wantCode: 127, wantErr: "cd: /no/such/dir: No such file or directory", wantStatus: "cd: /no/such/dir"},
			{name: "cwd-is-a-file", req: proto.ExecRequest{Argv: []string{"true"}, Cwd: "noexec.sh"},
				wantCode: 127, wantErr: "cd: " + filepath.Join(h.WS, "noexec.sh") + ": Not a directory", wantStatus: "Not a directory"},
			{name: "stdin", req: proto.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello stdin")},
				wantOut: "hello stdin"},
			{name: "no-stdin", req: proto.ExecRequest{Argv: []string{"cat"}}},
			{name: "env", req: proto.ExecRequest{ID: "env-id", Argv: []string{"sh", "-c", `echo "$FOO $SBX_EXEC_ID $HOME"`},
				Env: []string{"FOO=bar", "SBX_EXEC_ID=forged"}}, wantOut: "bar env-id /root\n"},
			{name: "cwd-default", req: proto.ExecRequest{Argv: []string{"pwd"}}, wantOut: h.WS + "\n"},
			{name: "cwd-relative", req: proto.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"}, wantOut: filepath.Join(h.WS, "sub") + "\n"},
			{name: "cwd-workspace-alias", req: proto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/workspace/sub"},
				wantOut: filepath.Join(h.WS, "sub") + "\n"},
			{name: "killed-by-signal", req: proto.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}},
				wantCode: 143, wantSignal: "SIGTERM"},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if tt.req.ID == "" {
					tt.req.ID = fmt.Sprintf("exec-%d", i)
				}
				res, err := h.C.Run(guesttest.Ctx(t, 20*time.Second), tt.req, 0, 0)
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if res.Exit.ExitCode != tt.wantCode || res.Exit.Signal != tt.wantSignal {
					t.Errorf("exit: got %d %q, want %d %q (stderr %q)", res.Exit.ExitCode, res.Exit.Signal, tt.wantCode, tt.wantSignal, res.Stderr)
				}
				if string(res.Stdout) != tt.wantOut {
					t.Errorf("stdout: got %q, want %q", res.Stdout, tt.wantOut)
				}
				if !strings.Contains(string(res.Stderr), tt.wantErr) || (tt.wantErr == "" && len(res.Stderr) > 0) {
					t.Errorf("stderr: got %q, want %q", res.Stderr, tt.wantErr)
				}
				if !strings.Contains(res.Exit.Error, tt.wantStatus) || (tt.wantStatus == "" && res.Exit.Error != "") {
					t.Errorf("exit error: got %q, want %q", res.Exit.Error, tt.wantStatus)
				}
				if res.Exit.EndedAt.IsZero() || res.Exit.TimedOut {
					t.Errorf("exit: got %+v, want an end time and not timed out", res.Exit)
				}
				info, err := h.C.Exec(guesttest.Ctx(t, 5*time.Second), tt.req.ID)
				if err != nil {
					t.Fatalf("Exec: %v", err)
				}
				if info.Running || info.Exit == nil || info.Exit.ExitCode != tt.wantCode {
					t.Errorf("Exec: got %+v, want ended with code %d", info, tt.wantCode)
				}
				if segs := execFiles(t, h.State, tt.req.ID); len(segs) == 0 {
					t.Errorf("state dir: got no log segment of %s, want some", tt.req.ID)
				}
			})
		}
	})
}

// TestExecPipesMadeAhead: an exec's output pipes are made after the exec before it ended, not
// in its start; every exec gets its own (no output crosses), and none is left open: the
// process's descriptors do not grow over many execs, and Close closes the spare ones.
func TestExecPipesMadeAhead(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 60*time.Second)
		run := func(id string) {
			t.Helper()
			res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", "echo out " + id + "; echo err " + id + " >&2"}}, 0, 0)
			if err != nil || res.Exit.ExitCode != 0 || string(res.Stdout) != "out "+id+"\n" || string(res.Stderr) != "err "+id+"\n" {
				t.Fatalf("exec %s: %+v %v (stdout %q, stderr %q)", id, res.Exit, err, res.Stdout, res.Stderr)
			}
		}
		run("first")
		waitFor(t, h.Srv.HasSparePipes)
		fds := openFDs(t)
		for i := range 20 {
			run(fmt.Sprintf("next-%d", i))
		}
		waitFor(t, h.Srv.HasSparePipes)
		if now := openFDs(t); now > fds {
			t.Fatalf("open descriptors: %d after 20 execs, %d before", now, fds)
		}
		h.Srv.Close()
		if h.Srv.HasSparePipes() {
			t.Fatal("the spare pipes outlived Close")
		}
	})
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestExecRecordOrder checks the records of one exec arrive in order, stdout and stderr kept
// apart, with the exit record last.
func TestExecRecordOrder(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	for i := range 20 {
		id := fmt.Sprintf("order-%d", i)
		// stdout and stderr are two pipes read one after the other: writes to both within one
		// read round (microseconds) may come out in either order, as with any two pipes. Writes
		// further apart keep their order.
		if _, err := h.C.StartExec(guesttest.Ctx(t, 5*time.Second), proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", "echo out; sleep 0.05; echo err >&2; exit 3"}}); err != nil {
			t.Fatal(err)
		}
		recs := guesttest.Records(t, h.C, id, 0, true)
		var kinds []byte
		var data []string
		for _, r := range recs {
			kinds = append(kinds, r.Kind)
			if r.Kind != proto.RecordExit {
				data = append(data, string(r.Data))
			}
		}
		if !bytes.Equal(kinds, []byte{proto.RecordStdout, proto.RecordStderr, proto.RecordExit}) || strings.Join(data, "") != "out\nerr\n" {
			t.Fatalf("records: got kinds %v data %q, want stdout, stderr, exit", kinds, data)
		}
		st, err := recs[2].ExitStatus()
		if err != nil || st.ExitCode != 3 {
			t.Fatalf("exit record: got %+v %v, want code 3", st, err)
		}
	}
}

func TestExecErrors(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverNetPipe)
	ctx := guesttest.Ctx(t, 10*time.Second)
	if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "dup", Argv: []string{"true"}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		code string
	}{
		{"reused-id", func() error {
			_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "dup", Argv: []string{"true"}})
			return err
		}, proto.ErrCodeExists},
		{"empty-argv", func() error {
			_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "x1"})
			return err
		}, proto.ErrCodeInvalid},
		{"bad-id", func() error {
			_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "a/b", Argv: []string{"true"}})
			return err
		}, proto.ErrCodeInvalid},
		{"long-id", func() error {
			_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: strings.Repeat("a", 65), Argv: []string{"true"}})
			return err
		}, proto.ErrCodeInvalid},
		{"bad-env", func() error {
			_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "x2", Argv: []string{"true"}, Env: []string{"NOEQUALS"}})
			return err
		}, proto.ErrCodeInvalid},
		{"unknown-exec", func() error {
			_, err := h.C.Exec(ctx, "nope")
			return err
		}, proto.ErrCodeNotFound},
		{"unknown-log", func() error {
			_, err := h.C.Log(ctx, "nope", 0, false)
			return err
		}, proto.ErrCodeNotFound},
		{"unknown-signal-target", func() error { return h.C.Signal(ctx, "nope", "SIGTERM") }, proto.ErrCodeNotFound},
		{"unknown-signal", func() error { return h.C.Signal(ctx, "dup", "SIGWHAT") }, proto.ErrCodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), tt.code) })
	}
}

func TestTimeoutKillsTree(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		tests := []struct {
			name string
			argv []string
		}{
			{"background-and-foreground", []string{"sh", "-c", "sleep 100 & sleep 100; "}},
			{"setsid-child", []string{"sh", "-c", "setsid sleep 100"}},
			{"setsid-background", []string{"sh", "-c", "setsid sleep 100 & sleep 100; "}},
			{"new-process-group", []string{"sh", "-c", "set -m; sleep 100 & wait"}},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				id := fmt.Sprintf("timeout-%d", i)
				start := time.Now()
				res, err := h.C.Run(guesttest.Ctx(t, 20*time.Second), proto.ExecRequest{ID: id, Argv: tt.argv, TimeoutMs: 300}, 0, 0)
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if !res.Exit.TimedOut || res.Exit.ExitCode != 137 || res.Exit.Signal != "SIGKILL" {
					t.Errorf("exit: got %+v, want timed out, 137, SIGKILL", res.Exit)
				}
				if d := time.Since(start); d > 3*time.Second {
					t.Errorf("took %v, want about 300ms", d)
				}
				guesttest.WaitTreeGone(t, id)
			})
		}
	})
}

func TestSignal(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		// A non-interactive shell starts background jobs with SIGINT ignored: SIGINT is
		// tried on a lone process.
		tree := "setsid sleep 100 & sleep 100 & exec sleep 100"
		tests := []struct {
			sig      string
			script   string
			procs    int
			wantCode int
		}{
			{"SIGTERM", tree, 3, 143},
			{"SIGKILL", tree, 3, 137},
			{"SIGINT", "exec sleep 100", 1, 130},
			{"HUP", tree, 3, 129},
		}
		for _, tt := range tests {
			t.Run(tt.sig, func(t *testing.T) {
				id := fmt.Sprintf("sig-%s-%v", tt.sig, opts.Reap)
				ctx := guesttest.Ctx(t, 20*time.Second)
				// exec replaces sh by sleep, so the main process dies of the signal itself.
				argv := []string{"sh", "-c", tt.script}
				if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: id, Argv: argv}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, func() bool { return len(guesttest.TreeLeft(id)) == tt.procs })
				if err := h.C.Signal(ctx, id, tt.sig); err != nil {
					t.Fatalf("Signal: %v", err)
				}
				recs := guesttest.Records(t, h.C, id, 0, true)
				st, err := recs[len(recs)-1].ExitStatus()
				if err != nil {
					t.Fatal(err)
				}
				if st.ExitCode != tt.wantCode || st.TimedOut {
					t.Errorf("exit: got %+v, want code %d", st, tt.wantCode)
				}
				guesttest.WaitTreeGone(t, id)
			})
		}
	})
}

// TestBackgroundHoldsStdout: a background process that inherited stdout must not hold the
// exec open much beyond one second after the main process exited.
func TestBackgroundHoldsStdout(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		start := time.Now()
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "bg", Argv: []string{"sh", "-c", "sleep 100 & echo hi"}}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if string(res.Stdout) != "hi\n" || res.Exit.ExitCode != 0 {
			t.Errorf("got %q %+v, want hi and code 0", res.Stdout, res.Exit)
		}
		if took < 900*time.Millisecond || took > 3*time.Second {
			t.Errorf("took %v, want about 1s", took)
		}
		if len(guesttest.TreeLeft("bg")) != 1 {
			t.Errorf("background sleep: got %v, want it still running", guesttest.TreeLeft("bg"))
		}
		// Signalling an ended exec still reaches what is left of its tree.
		if err := h.C.Signal(ctx, "bg", "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		guesttest.WaitTreeGone(t, "bg")
	})
}

// TestBackgroundFloodsStdout: a background process that keeps writing must not hold the
// exec open either.
func TestBackgroundFloodsStdout(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	start := time.Now()
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "flood", Argv: []string{"sh", "-c", "yes flood & sleep 0.1"}, MaxLogBytes: 1 << 20}, 100, 100)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("took %v, want about 1s", took)
	}
	if res.Exit.ExitCode != 0 || res.Exit.DroppedBytes == 0 || !res.StdoutTruncated {
		t.Errorf("got %+v truncated=%v, want code 0 with dropped bytes", res.Exit, res.StdoutTruncated)
	}
	if err := h.C.Signal(ctx, "flood", "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	guesttest.WaitTreeGone(t, "flood")
}

func TestLogReplayFromOffset(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	script := `for i in $(seq 1 300); do echo "line $i"; echo "err $i" >&2; [ $((i % 10)) = 0 ] && sleep 0.002; done; true`
	if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "replay", Argv: []string{"sh", "-c", script}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	all := guesttest.Records(t, h.C, "replay", 0, false)
	if len(all) < 8 {
		t.Fatalf("records: got %d, want many", len(all))
	}
	for _, mid := range []int{0, 1, len(all) / 2, len(all) - 2, len(all) - 1} {
		tail := guesttest.Records(t, h.C, "replay", all[mid].Offset, true)
		if len(tail) != len(all)-mid-1 {
			t.Fatalf("tail from record %d: got %d records, want %d", mid, len(tail), len(all)-mid-1)
		}
		for i, r := range tail {
			w := all[mid+1+i]
			if r.Kind != w.Kind || !bytes.Equal(r.Data, w.Data) || r.Offset != w.Offset {
				t.Fatalf("tail record %d: got %d %q @%d, want %d %q @%d", i, r.Kind, r.Data, r.Offset, w.Kind, w.Data, w.Offset)
			}
		}
	}
	size := all[len(all)-1].Offset
	for _, off := range []int64{-1, 1, all[1].Offset + 2, size + 1} {
		if _, err := h.C.Log(ctx, "replay", off, false); err == nil {
			t.Errorf("Log at offset %d: got no error, want invalid", off)
		} else {
			wantCode(t, err, proto.ErrCodeInvalid)
		}
	}
	if got := guesttest.Records(t, h.C, "replay", size, true); len(got) != 0 {
		t.Errorf("Log at the end: got %d records, want none", len(got))
	}
}

// TestLogLargeRecords: output larger than a record is cut at MaxRecordPayload and offsets
// stay valid across the sparse index.
func TestLogLargeRecords(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "big", Argv: []string{"head", "-c", "3000000", "/dev/urandom"}}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != 3000000 {
		t.Fatalf("stdout: got %d bytes, want 3000000", len(res.Stdout))
	}
	all := guesttest.Records(t, h.C, "big", 0, false)
	for _, r := range all {
		if len(r.Data) > proto.MaxRecordPayload {
			t.Fatalf("record payload: got %d, want ≤ %d", len(r.Data), proto.MaxRecordPayload)
		}
	}
	for _, mid := range []int{len(all) / 3, len(all) / 2, len(all) - 3} {
		tail := guesttest.Records(t, h.C, "big", all[mid].Offset, false)
		if len(tail) != len(all)-mid-1 || !bytes.Equal(tail[0].Data, all[mid+1].Data) {
			t.Fatalf("tail from %d: got %d records, want %d", mid, len(tail), len(all)-mid-1)
		}
		if _, err := h.C.Log(ctx, "big", all[mid].Offset+100, false); err == nil {
			t.Errorf("Log inside a record: got no error, want invalid")
		}
	}
}

// TestFollowerJoinsMidRun: followers that join while the command runs get every byte.
func TestFollowerJoinsMidRun(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	script := `for i in $(seq 1 40); do echo "n $i"; sleep 0.01; done`
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "follow", Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		info, err := h.C.Exec(ctx, "follow")
		return err == nil && info.LogBytes > 0
	})
	var want strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&want, "n %d\n", i)
	}
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 60 * time.Millisecond)
			var b strings.Builder
			for _, r := range guesttest.Records(t, h.C, "follow", 0, true) {
				if r.Kind == proto.RecordStdout {
					b.Write(r.Data)
				}
			}
			outs[i] = b.String()
		}()
	}
	wg.Wait()
	for i, got := range outs {
		if got != want.String() {
			t.Errorf("follower %d: got %q, want %q", i, got, want.String())
		}
	}
}

// TestMaxLogBytes: the log keeps the newest output within its bound; the exit status counts
// every byte written and the ones the log no longer holds; a reader from 0 gets a truncation
// marker and then the newest bytes.
func TestMaxLogBytes(t *testing.T) {
	h := guesttest.New(t, server.Options{DefaultMaxLogBytes: 5000}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	tests := []struct {
		name   string
		max    int64
		total  int
		budget int64
	}{
		{"request-bound", 8000, 100000, 8000},
		{"server-default", 0, 100000, 5000},
		{"fits", 1 << 20, 1000, 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "max-" + tt.name
			req := proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", fmt.Sprintf("seq 1 100000 | head -c %d", tt.total)}, MaxLogBytes: tt.max}
			res, err := h.C.Run(ctx, req, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Exit.StdoutBytes != int64(tt.total) || res.Exit.StderrBytes != 0 {
				t.Errorf("counts: got stdout %d stderr %d, want %d and 0", res.Exit.StdoutBytes, res.Exit.StderrBytes, tt.total)
			}
			var full bytes.Buffer
			for i := 1; full.Len() < tt.total; i++ {
				fmt.Fprintf(&full, "%d\n", i)
			}
			want := full.Bytes()[:tt.total]
			// A reader from 0 after the end: a marker when something was dropped, then the newest
			// bytes (a suffix of the output), then the exit record.
			recs := guesttest.Records(t, h.C, id, 0, false)
			var kept []byte
			for i, r := range recs {
				switch r.Kind {
				case proto.RecordTruncated:
					if i != 0 {
						t.Errorf("record %d: got a truncation marker, want it first", i)
					}
				case proto.RecordStdout:
					kept = append(kept, r.Data...)
				}
			}
			if got := int64(len(kept)) + res.Exit.DroppedBytes; got != int64(tt.total) {
				t.Errorf("kept %d + dropped %d = %d, want %d", len(kept), res.Exit.DroppedBytes, got, tt.total)
			}
			if !bytes.HasSuffix(want, kept) {
				t.Errorf("kept %d bytes, want the newest bytes of the output", len(kept))
			}
			if dropped := recs[0].Kind == proto.RecordTruncated; dropped != (tt.total > int(tt.budget)) {
				t.Errorf("marker: got %v, want %v", dropped, tt.total > int(tt.budget))
			}
			if last := recs[len(recs)-1]; last.Kind != proto.RecordExit {
				t.Errorf("last record: got kind %d, want the exit", last.Kind)
			}
			var headers int64
			for _, r := range recs {
				if r.Kind == proto.RecordStdout {
					headers += proto.RecordHeaderLen
				}
			}
			if int64(len(kept))+headers > tt.budget {
				t.Errorf("log bytes kept: got %d, want ≤ %d", int64(len(kept))+headers, tt.budget)
			}
			if tt.total < int(tt.budget) && res.Exit.DroppedBytes != 0 {
				t.Errorf("dropped: got %d, want 0", res.Exit.DroppedBytes)
			}
		})
	}
}

// TestKeepEndedBytes: the logs of ended execs, which live in the sandbox's memory, are
// bounded in bytes as well as in number: a sandbox running many commands with large output
// keeps the newest ended exec whatever its size, and older ones only within the bound.
func TestKeepEndedBytes(t *testing.T) {
	h := guesttest.New(t, server.Options{KeepEndedBytes: 64 << 10}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	run := func(id string, n int) {
		t.Helper()
		if _, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"head", "-c", strconv.Itoa(n), "/dev/zero"}}, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	listed := func() string {
		t.Helper()
		infos, err := h.C.Execs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, info := range infos {
			ids = append(ids, info.ID)
		}
		return strings.Join(ids, ",")
	}
	for i := range 4 {
		run(fmt.Sprintf("big-%d", i), 40<<10)
	}
	// big-3 is the newest; big-2's 40 KiB fit the 64 KiB bound, big-1's would not.
	if got, want := listed(), "big-2,big-3"; got != want {
		t.Errorf("after four 40 KiB execs: got %s, want %s", got, want)
	}
	for _, id := range []string{"big-0", "big-1"} {
		if files := execFiles(t, h.State, id); len(files) > 0 {
			t.Errorf("%s's files: %v, want them deleted", id, files)
		}
	}
	// One ended exec bigger than the bound on its own is kept while it is the newest.
	run("huge", 200<<10)
	if got, want := listed(), "big-3,huge"; got != want {
		t.Errorf("after a 200 KiB exec: got %s, want %s", got, want)
	}
	rs := guesttest.Records(t, h.C, "huge", 0, true)
	var n int
	for _, r := range rs {
		if r.Kind == proto.RecordStdout {
			n += len(r.Data)
		}
	}
	if n != 200<<10 {
		t.Errorf("huge's output: got %d bytes, want all %d", n, 200<<10)
	}
	// A small exec after it pushes it out, with big-3, once it is no longer the newest.
	run("small-0", 10)
	if got, want := listed(), "small-0"; got != want {
		t.Errorf("after a small exec: got %s, want %s", got, want)
	}
	run("small-1", 10)
	if got, want := listed(), "small-0,small-1"; got != want {
		t.Errorf("after two small execs: got %s, want %s", got, want)
	}
}

// execFiles lists the files of exec id in the state folder (its log's segments, <id>.log.<n>).
func execFiles(t *testing.T, state, id string) []string {
	t.Helper()
	entries, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), id+".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestExecStateFiles: what the init keeps of an exec is its log's segments as files of the
// state folder, with no folder per exec (each file or folder is kernel state a pause saves);
// forgetting the exec deletes them; files an earlier server left under an exec's id are
// deleted when an exec of that id starts, and never read as its output.
func TestExecStateFiles(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	for _, n := range []string{"left.log.0", "left.log.5", "left.log.x", "leftover.log.0"} {
		if err := os.WriteFile(filepath.Join(h.State, n), []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A link planted under a coming exec's segment name is removed, never written through.
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(h.State, "loud.log.0")); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if b, _ := os.ReadFile(target); string(b) != "kept" {
			t.Errorf("the planted link's target holds %q, want it untouched", b)
		}
	}()
	for _, id := range []string{"quiet", "loud", "left"} {
		argv := []string{"true"}
		if id != "quiet" {
			argv = []string{"printf", id}
		}
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: argv}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"quiet": "", "loud": "loud", "left": "left"}[id]; string(res.Stdout) != want {
			t.Fatalf("%s's output: %q, want %q", id, res.Stdout, want)
		}
	}
	entries, err := os.ReadDir(h.State)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("the state folder holds a folder %s", e.Name())
		}
	}
	if got := execFiles(t, h.State, "left"); !slices.Equal(got, []string{"left.log.0", "left.log.x"}) {
		t.Errorf("files of exec left: %v, want its own segment and the file that is no segment", got)
	}
	if got := execFiles(t, h.State, "loud"); !slices.Equal(got, []string{"loud.log.0"}) {
		t.Errorf("files of exec loud: %v, want [loud.log.0]", got)
	}
	for _, id := range []string{"quiet", "loud", "left"} {
		if err := h.C.Forget(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"quiet", "loud"} {
		if got := execFiles(t, h.State, id); len(got) > 0 {
			t.Errorf("after its forget, exec %s left %v", id, got)
		}
	}
	if got := execFiles(t, h.State, "leftover"); !slices.Equal(got, []string{"leftover.log.0"}) {
		t.Errorf("another id's file: %v, want it untouched", got)
	}
}

func TestExecLimits(t *testing.T) {
	h := guesttest.New(t, server.Options{MaxRunning: 2, KeepEnded: 3}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	for _, id := range []string{"run-1", "run-2"} {
		if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: id, Argv: []string{"sleep", "100"}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "run-3", Argv: []string{"true"}})
	wantCode(t, err, proto.ErrCodeUnavailable)
	// The caller's own bound (the control plane's cap per sandbox) is counted here too.
	_, err = h.C.StartExec(ctx, proto.ExecRequest{ID: "run-3", Argv: []string{"true"}, MaxRunning: 1})
	wantCode(t, err, proto.ErrCodeTooMany)
	_, err = h.C.StartExec(ctx, proto.ExecRequest{ID: "run-3", Argv: []string{"true"}, MaxRunning: -1})
	wantCode(t, err, proto.ErrCodeInvalid)
	for _, id := range []string{"run-1", "run-2"} {
		if err := h.C.Signal(ctx, id, "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		guesttest.Records(t, h.C, id, 0, true)
	}
	for i := range 4 {
		if _, err := h.C.Run(ctx, proto.ExecRequest{ID: fmt.Sprintf("done-%d", i), Argv: []string{"true"}}, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := h.C.Execs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, info := range infos {
		ids = append(ids, info.ID)
	}
	if got, want := strings.Join(ids, ","), "done-1,done-2,done-3"; got != want {
		t.Errorf("Execs: got %s, want %s", got, want)
	}
	for _, id := range []string{"run-1", "run-2", "done-0"} {
		_, err := h.C.Exec(ctx, id)
		wantCode(t, err, proto.ErrCodeNotFound)
		if files := execFiles(t, h.State, id); len(files) > 0 {
			t.Errorf("state of dropped exec %s: got %v, want removed", id, files)
		}
	}
	// Under its own bound, an exec starts.
	if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "capped", Argv: []string{"true"}, MaxRunning: 1}, 0, 0); err != nil {
		t.Errorf("an exec under its MaxRunning: %v", err)
	}
	// A dropped id may be used again.
	if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "run-1", Argv: []string{"true"}}, 0, 0); err != nil {
		t.Errorf("reusing a dropped id: %v", err)
	}
}

func TestCloseKillsExecs(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "long", Argv: []string{"sh", "-c", "setsid sleep 100 & sleep 100"}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return len(guesttest.TreeLeft("long")) == 3 })
		lr, err := h.C.Log(ctx, "long", 0, true)
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close()
		h.Srv.Close()
		guesttest.WaitTreeGone(t, "long")
		// The follower ends: with the exit record, or because the stream went away.
		for {
			if _, err := lr.Next(); err != nil {
				break
			}
		}
		select {
		case <-h.C.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("client: Done not closed after the server closed")
		}
		_, err = h.C.Health(ctx)
		if !errors.Is(err, client.ErrClosed) {
			t.Errorf("Health after close: got %v, want ErrClosed", err)
		}
	})
}

// TestReaperReapsOrphans: in reap mode, orphans re-parented to the server are reaped.
func TestReaperReapsOrphans(t *testing.T) {
	h := guesttest.New(t, server.Options{Reap: true}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "orphans", Argv: []string{"sh", "-c", "(sleep 0.2 &) ; (sleep 0.2 &); true"}}, 0, 0)
	if err != nil || res.Exit.ExitCode != 0 {
		t.Fatalf("Run: %+v %v", res.Exit, err)
	}
	waitFor(t, func() bool { return len(zombieChildren()) == 0 && len(guesttest.TreeLeft("orphans")) == 0 })
}

// zombieChildren lists zombies whose parent is this process.
func zombieChildren() []int {
	self := fmt.Sprint(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == self {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			out = append(out, pid)
		}
	}
	return out
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func BenchmarkRunTrue(b *testing.B) {
	runTrue(b, guesttest.New(b, server.Options{KeepEnded: 100}, guesttest.OverSocketpair))
}

// BenchmarkRunTrueStream is BenchmarkRunTrue over exec streams (proto/stream.go).
func BenchmarkRunTrueStream(b *testing.B) {
	h := guesttest.New(b, server.Options{KeepEnded: 100}, guesttest.OverSocketpair)
	streams := h.UseExecStreams(b)
	runTrue(b, h)
	if n := streams.Dials(); n != 1 {
		b.Fatalf("%d streams dialled for one exec at a time, want 1", n)
	}
}

// runTrue runs `true` b.N times through h's client.
func runTrue(b *testing.B, h *guesttest.Harness) {
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: fmt.Sprintf("b-%d", i), Argv: []string{"true"}}, 0, 0)
		if err != nil || res.Exit.ExitCode != 0 {
			b.Fatalf("Run: %+v %v", res.Exit, err)
		}
	}
}

// BenchmarkStartProcessTrue is the floor BenchmarkRunTrue compares with: a plain fork, exec
// and wait of `true` from Go, without the protocol.
func BenchmarkStartProcessTrue(b *testing.B) {
	for b.Loop() {
		p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{
			Files: []*os.File{nil, nil, nil},
			Sys:   &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHealth is one protocol round trip over the stream.
func BenchmarkHealth(b *testing.B) {
	h := guesttest.New(b, server.Options{}, guesttest.OverSocketpair)
	ctx := context.Background()
	for b.Loop() {
		if _, err := h.C.Health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestForget: an ended exec is forgotten as if it never ran (record, log, folder, what it left
// running); a running one is refused, an unknown one is not found, and the others stay.
func TestForget(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		keep, err := h.C.Run(ctx, proto.ExecRequest{ID: "keep", Argv: []string{"sh", "-c", "echo kept"}}, 0, 0)
		if err != nil || string(keep.Stdout) != "kept\n" {
			t.Fatalf("keep: got %q, %v", keep.Stdout, err)
		}
		// The command leaves a process behind, which must not outlive its forgetting.
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "gone", Argv: []string{"sh", "-c", "sleep 100 & echo warm"}}, 0, 0)
		if err != nil || string(res.Stdout) != "warm\n" {
			t.Fatalf("gone: got %q, %v", res.Stdout, err)
		}
		if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "running", Argv: []string{"sleep", "100"}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.C.Signal(context.Background(), "running", "SIGKILL") })
		wantCode(t, h.C.Forget(ctx, "running"), proto.ErrCodeState)
		wantCode(t, h.C.Forget(ctx, "nosuch"), proto.ErrCodeNotFound)
		wantCode(t, h.C.Forget(ctx, "../keep"), proto.ErrCodeNotFound)

		if err := h.C.Forget(ctx, "gone"); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		guesttest.WaitTreeGone(t, "gone")
		_, err = h.C.Exec(ctx, "gone")
		wantCode(t, err, proto.ErrCodeNotFound)
		_, err = h.C.Log(ctx, "gone", 0, false)
		wantCode(t, err, proto.ErrCodeNotFound)
		wantCode(t, h.C.Signal(ctx, "gone", "SIGKILL"), proto.ErrCodeNotFound)
		wantCode(t, h.C.Forget(ctx, "gone"), proto.ErrCodeNotFound)
		if files := execFiles(t, h.State, "gone"); len(files) > 0 {
			t.Errorf("the forgotten exec's files: got %v, want them gone", files)
		}
		infos, err := h.C.Execs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, in := range infos {
			ids = append(ids, in.ID)
		}
		if !slices.Equal(ids, []string{"keep", "running"}) {
			t.Errorf("execs after Forget: got %v, want [keep running]", ids)
		}
		if recs := guesttest.Records(t, h.C, "keep", 0, false); len(recs) == 0 {
			t.Error("the other ended exec lost its log")
		}
		// The id is free again, and a new exec of it starts afresh.
		again, err := h.C.Run(ctx, proto.ExecRequest{ID: "gone", Argv: []string{"sh", "-c", "echo again"}}, 0, 0)
		if err != nil || string(again.Stdout) != "again\n" {
			t.Errorf("a new exec of the forgotten id: got %q, %v", again.Stdout, err)
		}
	})
}

// readCountingConn records the size of every read the server makes of its stream.
type readCountingConn struct {
	net.Conn
	mu    sync.Mutex
	reads int
	small int // reads that asked for fewer than 4 KiB
}

func (c *readCountingConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.reads++
	if len(p) < 4<<10 {
		c.small++
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// TestLogReadsTheStreamBuffered: while a client follows a large log it sends the server a
// pair of WINDOW_UPDATE frames per read of the body. The server must not read each frame's
// 9-byte header and 4-byte payload from the stream one by one: under gVisor every read of the
// host socket is a context switch. Every read of the stream asks for a buffer's worth, and the
// output arrives whole.
func TestLogReadsTheStreamBuffered(t *testing.T) {
	var counted *readCountingConn
	h := guesttest.NewWrapped(t, server.Options{}, guesttest.OverSocketpair, func(c net.Conn) net.Conn {
		counted = &readCountingConn{Conn: c}
		return counted
	})
	const size = 16 << 20
	res, err := h.C.Run(guesttest.Ctx(t, 60*time.Second), proto.ExecRequest{ID: "flood", Argv: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != size || res.Exit.ExitCode != 0 {
		t.Fatalf("stdout: got %d bytes (exit %d), want %d", len(res.Stdout), res.Exit.ExitCode, size)
	}
	counted.mu.Lock()
	defer counted.mu.Unlock()
	if counted.reads == 0 || counted.small > 0 {
		t.Errorf("the server read its stream %d times, %d of them for fewer than 4 KiB: want every read buffered", counted.reads, counted.small)
	}
}

// TestExecAllocatesLittle: an exec of a command without output allocates little (the server and
// its client together, both in this process). Each exec's collector used to make its own 1 MiB
// read buffer: PID 1 then collected every exec or two and gave the pages back with madvise, a
// host round trip each under gVisor, on the exec's path.
func TestExecAllocatesLittle(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 60*time.Second)
	i := 0
	per := allocatedPer(5, 20, func() {
		t.Helper()
		i++
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "alloc-" + strconv.Itoa(i), Argv: []string{"true"}}, 0, 0)
		if err != nil || res.Exit.ExitCode != 0 {
			t.Fatalf("exec %d: %v (exit %d)", i, err, res.Exit.ExitCode)
		}
	})
	t.Logf("an exec of true allocated %d KiB", per>>10)
	if per > 512<<10 {
		t.Errorf("an exec of true allocated %d KiB, want under 512 KiB", per>>10)
	}
}

// TestReusedReadBufferCarriesNothingOver: the collectors' read buffers are kept for the next
// execs; a short output after a long one is exactly what the second command wrote, never
// bytes the first left in the buffer.
func TestReusedReadBufferCarriesNothingOver(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	long, err := h.C.Run(ctx, proto.ExecRequest{ID: "long", Argv: []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' A"}}, 0, 0)
	if err != nil || len(long.Stdout) != 300000 {
		t.Fatalf("long: %v, %d bytes", err, len(long.Stdout))
	}
	for i := range 3 {
		res, err := h.C.Run(ctx, proto.ExecRequest{ID: "short-" + strconv.Itoa(i), Argv: []string{"printf", "b"}}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "b" || len(res.Stderr) != 0 || res.Exit.StdoutBytes != 1 {
			t.Fatalf("short %d: stdout %q (%d bytes), stderr %q, want exactly b", i, res.Stdout[:min(len(res.Stdout), 20)], res.Exit.StdoutBytes, res.Stderr)
		}
	}
}

// TestReleaseWithoutCgroups: an init that tracks an exec's processes without cgroups (the
// harness runs outside a sandbox, where it has none) cannot tell that nothing of an ended exec
// runs, so a release keeps every exec that started: ended, running, and one that left a
// process behind; it forgets one whose command never started. Unknown and malformed ids are
// skipped; a batch over the bound is refused whole. (The release of execs tracked by cgroups
// is shown end to end: tests.TestEndedExecsLeaveTheGuest.)
func TestReleaseWithoutCgroups(t *testing.T) {
	modes(t, func(t *testing.T, opts server.Options) {
		h := guesttest.New(t, opts, guesttest.OverSocketpair)
		ctx := guesttest.Ctx(t, 20*time.Second)
		if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "ended", Argv: []string{"true"}}, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := h.C.Run(ctx, proto.ExecRequest{ID: "left", Argv: []string{"sh", "-c", "sleep 100 &"}}, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "running", Argv: []string{"sleep", "100"}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = h.C.Signal(context.Background(), "running", "SIGKILL")
			_ = h.C.Signal(context.Background(), "left", "SIGKILL")
		})
		if res, err := h.C.Run(ctx, proto.ExecRequest{ID: "unstarted", Argv: []string{"no-such-program-release"}}, 0, 0); err != nil || res.Exit.ExitCode != 127 {
			t.Fatalf("unstarted: %+v, %v, want exit 127", res.Exit, err)
		}
		res, err := h.C.Release(ctx, []string{"ended", "left", "running", "nosuch", "../ended", "", "unstarted"})
		if err != nil || res.Released != 1 {
			t.Fatalf("Release: got %+v, %v, want the unstarted exec alone released", res, err)
		}
		_, err = h.C.Exec(ctx, "unstarted")
		wantCode(t, err, proto.ErrCodeNotFound)
		if files := execFiles(t, h.State, "unstarted"); len(files) > 0 {
			t.Errorf("the released exec's files: %v, want them gone", files)
		}
		for _, id := range []string{"ended", "left", "running"} {
			if _, err := h.C.Exec(ctx, id); err != nil {
				t.Errorf("%s after the release: %v, want it kept", id, err)
			}
			if files := execFiles(t, h.State, id); len(files) == 0 {
				t.Errorf("%s after the release: its log's files are gone", id)
			}
		}
		_, err = h.C.Release(ctx, make([]string, proto.MaxReleaseIDs+1))
		wantCode(t, err, proto.ErrCodeInvalid)
	})
}

// TestCommandRemovesItsLog: a command (root in a box, where the state folder is within its
// reach) that removes its own exec's log files loses its output to later readers, and only
// that: a reader from the start gets a marker over the bytes that are gone and the exit, at
// once, where it used to wait for the file forever, and the server serves on.
func TestCommandRemovesItsLog(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 30*time.Second)
	script := `head -c 200000 /dev/zero; rm -f "$LOGS/$` + proto.ExecIDEnv + `".log.*; echo after`
	res, err := h.C.Run(ctx, proto.ExecRequest{ID: "self-rm", Argv: []string{"sh", "-c", script}, Env: []string{"LOGS=" + h.State}}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The live follower got what it had read before the removal and a marker over what it had
	// not (StdoutTruncated), or everything, and the exit.
	if res.Exit.ExitCode != 0 || len(res.Stdout) != 200006 && !res.StdoutTruncated || len(res.Stdout) > 200006 {
		t.Fatalf("got exit %+v and %d bytes of stdout (truncated %v), want 0 and every byte or the truncated flag",
			res.Exit, len(res.Stdout), res.StdoutTruncated)
	}
	got := make(chan []client.Record, 1)
	go func() { got <- guesttest.Records(t, h.C, "self-rm", 0, true) }()
	select {
	case recs := <-got:
		if len(recs) != 2 || recs[0].Kind != proto.RecordTruncated || recs[1].Kind != proto.RecordExit {
			t.Fatalf("a reader from the start got %d records (%+v), want a marker and the exit", len(recs), recs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reader of the removed log did not end within 10 s")
	}
	if res, err := h.C.Run(ctx, proto.ExecRequest{ID: "next", Argv: []string{"echo", "ok"}}, 0, 0); err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("the next exec: %q, %v", res.Stdout, err)
	}
}
