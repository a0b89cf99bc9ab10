package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/net/http2"

	"sandboxd/guest/client"
)

// hostileExporter is a peer that answers like a guest init, with an export of its choosing.
func hostileExporter(t *testing.T, export http.HandlerFunc) *client.Client {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	mux.HandleFunc("GET /v1/workspace/tar", export)
	return servePeer(t, mux)
}

// servePeer serves mux over HTTP/2 as a guest init would (it must answer GET /v1/health) and
// returns a client Dialed to it; both end with the test.
func servePeer(t *testing.T, mux *http.ServeMux) *client.Client {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&http2.Server{}).ServeConn(b, &http2.ServeConnOpts{Handler: mux})
	}()
	c, err := client.Dial(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		b.Close()
		<-done
	})
	return c
}

// TestExportRefusesWhatTheGuestShouldNotSend: an export compressed with a window past the
// client's bound, or in an encoding the client never asked for, is refused, not decoded into
// whatever memory the guest wants.
func TestExportRefusesWhatTheGuestShouldNotSend(t *testing.T) {
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	for name, h := range map[string]http.HandlerFunc{
		"window-64MiB": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "zstd")
			zw, _ := zstd.NewWriter(w, zstd.WithWindowSize(64<<20))
			_, _ = zw.Write(big)
			_ = zw.Close()
		},
		"brotli": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "br")
			_, _ = w.Write([]byte("whatever"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := hostileExporter(t, h)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rc, err := c.ExportWorkspace(ctx)
			if err == nil {
				_, err = io.Copy(io.Discard, rc)
				rc.Close()
			}
			if err == nil {
				t.Fatalf("the export was read without an error")
			}
			if name == "window-64MiB" && !strings.Contains(err.Error(), "window") {
				t.Errorf("got %v, want the window refused", err)
			}
			if name == "brotli" && !strings.Contains(err.Error(), "unknown encoding") {
				t.Errorf("got %v, want the unknown encoding named", err)
			}
		})
	}

	// A well-behaved compressed export reads back whole.
	want := bytes.Repeat([]byte("tar bytes "), 100000)
	c := hostileExporter(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("compress") != "zstd" {
			t.Errorf("the client did not ask for zstd: %s", r.URL)
		}
		w.Header().Set("Content-Encoding", "zstd")
		zw, _ := zstd.NewWriter(w, zstd.WithWindowSize(1<<20))
		_, _ = zw.Write(want)
		_ = zw.Close()
	})
	rc, err := c.ExportWorkspace(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("read %d bytes (%v), want %d", len(got), err, len(want))
	}
}
