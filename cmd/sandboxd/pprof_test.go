package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sandboxd/internal/version"
)

func TestCheckPprofAddr(t *testing.T) {
	tests := []struct {
		addr string
		ok   bool
	}{
		{"", true},
		{"127.0.0.1:6060", true},
		{"127.0.0.2:6060", true},
		{"[::1]:6060", true},
		{"127.0.0.1:0", true},
		{":6060", false},               // every interface
		{"0.0.0.0:6060", false},        // every interface
		{"[::]:6060", false},           // every interface
		{"10.1.2.3:6060", false},       // a network
		{"localhost:6060", false},      // a name: what it resolves to is not checked here
		{"127.0.0.1", false},           // no port
		{"127.0.0.1:http", false},      // a service name
		{"127.0.0.1:70000", false},     // out of range
		{"[::ffff:10.0.0.1]:1", false}, // a mapped network address
	}
	for _, tt := range tests {
		err := checkPprofAddr(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("checkPprofAddr(%q): got %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
}

// A non-loopback pprof_addr is a config error that names the setting and how to set it.
func TestPprofConfig(t *testing.T) {
	c, err := load(t, "{}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.PprofAddr != "" {
		t.Errorf("pprof_addr: got %q by default, want empty (off)", c.PprofAddr)
	}
	if c, err = load(t, "pprof_addr: 127.0.0.1:6061\n"); err != nil || c.PprofAddr != "127.0.0.1:6061" {
		t.Errorf("pprof_addr 127.0.0.1:6061: got %q, %v; want it taken", c.PprofAddr, err)
	}
	_, err = load(t, "pprof_addr: 0.0.0.0:6060\n")
	if err == nil || !strings.Contains(err.Error(), "must be a loopback address") || !strings.Contains(err.Error(), "--pprof-addr") {
		t.Errorf("pprof_addr 0.0.0.0:6060: got %v, want a config error naming the loopback rule and --pprof-addr", err)
	}
}

// startPprof serves the profiles on its own loopback listener; the API's mux has none of them.
func TestPprofServes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	stop, err := startPprof(addr, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("GET %s: got %d with %d bytes, want 200 with a body", path, resp.StatusCode, len(body))
		}
	}
	if _, err := startPprof("0.0.0.0:0", slog.New(slog.DiscardHandler)); err == nil {
		t.Errorf("startPprof(0.0.0.0:0): got no error, want the loopback rule")
	}
	stop()
	if _, err := http.Get("http://" + addr + "/debug/pprof/"); err == nil {
		t.Errorf("GET after stop: got an answer, want the listener closed")
	}
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo())
	want := `# HELP sandboxd_build_info Always 1; the labels say which build this replica runs.
# TYPE sandboxd_build_info gauge
sandboxd_build_info{goversion="` + version.GoVersion() + `",revision="` + version.Revision() + `",version="` + version.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sandboxd_build_info"); err != nil {
		t.Error(err)
	}
}

func TestIsVersionArg(t *testing.T) {
	for arg, want := range map[string]bool{"version": true, "--version": true, "-version": true, "-v": false, "versions": false, "": false} {
		if got := isVersionArg(arg); got != want {
			t.Errorf("isVersionArg(%q): got %v, want %v", arg, got, want)
		}
	}
}
