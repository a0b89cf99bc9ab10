package resolvers

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A panic while a WebSocket is served detached never takes the server down: before the hijack
// net/http recovers it as for any request (its goroutine gets it back), after it serveDetached
// logs it.
func TestServeDetachedPanics(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	for name, afterHijack := range map[string]bool{"before the hijack": false, "after the hijack": true} {
		t.Run(name, func(t *testing.T) {
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/boom" {
					return
				}
				if afterHijack {
					conn, brw, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("hijack: %v", err)
						return
					}
					brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n\r\n")
					brw.Flush()
					defer conn.Close()
				}
				panic("boom " + name)
			})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				serveDetached(next, w, r, nil, log)
			}))
			srv.Config.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelError) // net/http's recovered panics
			srv.Start()
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
			// The connection ends (net/http closes it after a panic; the panicking handler
			// closed the hijacked one).
			_, _ = io.ReadAll(bufio.NewReader(conn))
			// The server still serves.
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatalf("the server after the panic: %v", err)
			}
			resp.Body.Close()
			want := "boom " + name
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), want); {
				if time.Now().After(deadline) {
					t.Fatalf("the panic was not logged (%q): %s", want, logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
