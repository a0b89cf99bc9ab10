package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/guest/client"
	"sandboxd/guest/guesttest"
	"sandboxd/guest/proto"
	"sandboxd/guest/server"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunCaps(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	tests := []struct {
		name                    string
		maxOut, maxErr          int
		wantOut, wantErr        string
		wantOutTrunc, wantTrErr bool
	}{
		{"no-caps", 0, 0, "0123456789", "abcdefghij", false, false},
		{"stdout-capped", 4, 100, "6789", "abcdefghij", true, false},
		{"stderr-capped", 100, 3, "0123456789", "hij", false, true},
		{"exact", 10, 10, "0123456789", "abcdefghij", false, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := proto.ExecRequest{ID: fmt.Sprintf("caps-%d", i), Argv: []string{"sh", "-c", "printf 01234; printf 56789; printf abcdefghij >&2"}}
			res, err := h.C.Run(guesttest.Ctx(t, 10*time.Second), req, tt.maxOut, tt.maxErr)
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tt.wantOut || res.StdoutTruncated != tt.wantOutTrunc {
				t.Errorf("stdout: got %q %v, want %q %v", res.Stdout, res.StdoutTruncated, tt.wantOut, tt.wantOutTrunc)
			}
			if string(res.Stderr) != tt.wantErr || res.StderrTruncated != tt.wantTrErr {
				t.Errorf("stderr: got %q %v, want %q %v", res.Stderr, res.StderrTruncated, tt.wantErr, tt.wantTrErr)
			}
		})
	}
	t.Run("cancel-keeps-running", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := h.C.Run(ctx, proto.ExecRequest{ID: "cancelled", Argv: []string{"sleep", "100"}}, 0, 0)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run: got %v, want deadline exceeded", err)
		}
		info, err := h.C.Exec(guesttest.Ctx(t, 5*time.Second), "cancelled")
		if err != nil || !info.Running {
			t.Fatalf("Exec: got %+v %v, want still running", info, err)
		}
		if err := h.C.Signal(guesttest.Ctx(t, 5*time.Second), "cancelled", "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		guesttest.WaitTreeGone(t, "cancelled")
	})
}

func TestConcurrentCalls(t *testing.T) {
	for _, tr := range []struct {
		name string
		tr   guesttest.Transport
	}{{"socketpair", guesttest.OverSocketpair}, {"netpipe", guesttest.OverNetPipe}} {
		t.Run(tr.name, func(t *testing.T) {
			h := guesttest.New(t, server.Options{}, tr.tr)
			ctx := guesttest.Ctx(t, 60*time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, 200)
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("c-%d", i)
					res, err := h.C.Run(ctx, proto.ExecRequest{ID: id, Argv: []string{"sh", "-c", "echo $SBX_EXEC_ID; head -c 100000 /dev/zero"}}, 0, 0)
					if err != nil {
						errs <- err
						return
					}
					if want := id + "\n"; !strings.HasPrefix(string(res.Stdout), want) || len(res.Stdout) != len(want)+100000 {
						errs <- fmt.Errorf("%s: got %d bytes of stdout", id, len(res.Stdout))
					}
					name := fmt.Sprintf("dir-%d/file", i)
					content := strings.Repeat(id, 1000)
					if _, err := h.C.WriteFile(ctx, name, 0o600, strings.NewReader(content)); err != nil {
						errs <- err
						return
					}
					rc, _, err := h.C.ReadFile(ctx, name)
					if err != nil {
						errs <- err
						return
					}
					var b bytes.Buffer
					_, err = b.ReadFrom(rc)
					rc.Close()
					if err != nil || b.String() != content {
						errs <- fmt.Errorf("%s: read back %d bytes, %v", name, b.Len(), err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestBrokenStream(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	if _, err := h.C.StartExec(ctx, proto.ExecRequest{ID: "survivor", Argv: []string{"sh", "-c", "sleep 0.3; echo done"}}); err != nil {
		t.Fatal(err)
	}
	lr, err := h.C.Log(ctx, "survivor", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	_ = h.ServerEnd.Close()
	if _, err := lr.Next(); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Next on a broken stream: got %v, want ErrClosed", err)
	}
	select {
	case <-h.C.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	if _, err := h.C.Exec(ctx, "survivor"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Exec on a broken stream: got %v, want ErrClosed", err)
	}
	// The exec belongs to the server: a new attach finds it finished with its output.
	a, b := guesttest.Socketpair(t)
	go h.Srv.ServeConn(a)
	c2, err := client.Dial(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	var out []byte
	for _, r := range guesttest.Records(t, c2, "survivor", 0, true) {
		if r.Kind == proto.RecordStdout {
			out = append(out, r.Data...)
		}
	}
	if string(out) != "done\n" {
		t.Errorf("output after reattach: got %q, want done", out)
	}
}

func TestDialFailsOnDeadStream(t *testing.T) {
	a, b := guesttest.Socketpair(t)
	_ = a.Close()
	_, err := client.Dial(b)
	if !errors.Is(err, client.ErrClosed) {
		t.Errorf("Dial on a dead stream: got %v, want ErrClosed", err)
	}
}

// TestDialUnchecked: without the health call, the client serves calls on a live stream, and on a
// dead one its first call, not the dial, fails with ErrClosed.
func TestDialUnchecked(t *testing.T) {
	h := guesttest.New(t, server.Options{}, guesttest.OverSocketpair)
	ctx := guesttest.Ctx(t, 20*time.Second)
	a, b := guesttest.Socketpair(t)
	go h.Srv.ServeConn(a)
	c, err := client.DialUnchecked(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Health(ctx); err != nil {
		t.Fatalf("Health on an unchecked client: %v", err)
	}

	dead, other := guesttest.Socketpair(t)
	_ = dead.Close()
	c2, err := client.DialUnchecked(ctx, other)
	if err != nil {
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("DialUnchecked on a dead stream: got %v, want nil or ErrClosed", err)
		}
		return
	}
	defer c2.Close()
	if _, err := c2.Health(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("the first call on a dead stream: got %v, want ErrClosed", err)
	}
}
