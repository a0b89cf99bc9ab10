package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVsNote(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x*float64(time.Millisecond)))
		}
		return out
	}
	// Rounds 1, 2 and 4 faster; differences -1, -2, +1, -0.5: median -0.75 ms.
	got := vsNote(ms(10, 10, 12, 9.5), ms(11, 12, 11, 10), 27*time.Millisecond, 29*time.Millisecond, "its cgroup's usage")
	for _, want := range []string{"faster in 3 of 4 rounds", "is -0.75 ms", "(its cgroup's usage): this build 27.0 ms, the --vs build 29.0 ms"} {
		if !strings.Contains(got, want) {
			t.Errorf("vsNote = %q, want it to say %q", got, want)
		}
	}
	if got := vsNote(ms(12), ms(11), 0, 0, ""); !strings.Contains(got, "faster in 0 of 1 rounds") || !strings.Contains(got, "+1.00 ms") {
		t.Errorf("vsNote of a slower round = %q", got)
	}
	if got := vsNote(nil, nil, 0, 0, ""); !strings.Contains(got, "0 of 0 rounds") || !strings.Contains(got, "is none") {
		t.Errorf("vsNote of no rounds = %q", got)
	}
}

func TestVsSuiteIsOptIn(t *testing.T) {
	all, err := selectSuites("")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.name == "vs" {
			t.Error("the default run includes the vs suite, which needs a second build")
		}
	}
	if len(all) != len(suites)-1 {
		t.Errorf("the default run has %d suites, want every one but vs (%d)", len(all), len(suites)-1)
	}
	only, err := selectSuites("vs")
	if err != nil || len(only) != 1 || only[0].name != "vs" {
		t.Errorf("--only vs selects %v (%v)", only, err)
	}
}

// TestHasSpawner: the vs suite compares builds only when both sides' inits have the spawner
// program beside them, or neither has: one without it is slower by that alone.
func TestHasSpawner(t *testing.T) {
	with, without := t.TempDir(), t.TempDir()
	for _, d := range []string{with, without} {
		for _, f := range []string{"sandbox-init", "sandboxd"} {
			if err := os.WriteFile(filepath.Join(d, f), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(with, spawnerName), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(without, spawnerName), nil, 0o644); err != nil { // not executable
		t.Fatal(err)
	}
	if !hasSpawner(filepath.Join(with, "sandbox-init")) {
		t.Error("an executable sandbox-spawn beside the init is not seen")
	}
	if hasSpawner(filepath.Join(without, "sandbox-init")) {
		t.Error("a sandbox-spawn that cannot run counts as the spawner program")
	}
	b := &bench{opts: &options{sandboxd: filepath.Join(with, "sandboxd"), initBin: filepath.Join(with, "sandbox-init"),
		vsSandboxd: filepath.Join(without, "sandboxd"), vsInit: filepath.Join(without, "sandbox-init"), vsRounds: 1, execN: 1, vsCommand: "true"}}
	b.server = &server{}
	if _, err := benchVs(t.Context(), b); err == nil || !strings.Contains(err.Error(), "only one side has the spawner program") {
		t.Errorf("a vs run with the spawner on one side only: got %v, want it refused", err)
	}
}

// TestVsRefusesBadInput: a vs run with nothing to compare, an empty command or a --vs-rootfs
// that is no rootfs is refused before any server starts.
func TestVsRefusesBadInput(t *testing.T) {
	bin := t.TempDir()
	for _, f := range []string{"sandboxd", "sandbox-init"} {
		if err := os.WriteFile(filepath.Join(bin, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	base := options{sandboxd: filepath.Join(bin, "sandboxd"), initBin: filepath.Join(bin, "sandbox-init"), vsRounds: 1, execN: 1, vsCommand: "true"}
	for _, c := range []struct {
		name string
		set  func(o *options)
		want string
	}{
		{"nothing to compare", func(o *options) {}, "needs --vs-sandboxd, --vs-init-binary or --vs-rootfs"},
		{"empty command", func(o *options) { o.vsRootfs = t.TempDir(); o.vsCommand = "  " }, "--vs-command is empty"},
		{"not a rootfs", func(o *options) { o.vsRootfs = t.TempDir() }, "not a rootfs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := base
			c.set(&o)
			b := &bench{opts: &o, server: &server{}, tmp: t.TempDir()}
			_, err := benchVs(context.Background(), b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("benchVs = %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestVsExecFirstByte: with --vs-first-byte an exec is timed to its first stdout bytes, not to
// its exit, and one that writes nothing to stdout, fails, or never ends is an error.
func TestVsExecFirstByte(t *testing.T) {
	const gap = 150 * time.Millisecond
	cases := []struct {
		name   string
		events string // after a pause of gap following the first chunk, if any
		chunk  bool
		exit   string
		want   string // error text; "" for a result
	}{
		{name: "output then exit", chunk: true, exit: `{"exit_code":0}`},
		{name: "no stdout", exit: `{"exit_code":0}`, want: "wrote nothing to stdout"},
		{name: "failed", chunk: true, exit: `{"exit_code":3}`, want: "exit 3"},
		{name: "no exit event", chunk: true, want: "without an exit event"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != restPrefix+"/sbx_1/exec" || r.Header.Get("Accept") != "text/event-stream" {
					http.Error(w, "unexpected request", http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "event: started\ndata: {}\n\n")
				if c.chunk {
					fmt.Fprint(w, "event: chunk\ndata: {\"stream\":\"stdout\",\"data\":\"x\\n\"}\n\n")
				}
				w.(http.Flusher).Flush()
				time.Sleep(gap)
				if c.exit != "" {
					fmt.Fprintf(w, "event: exit\ndata: %s\n\n", c.exit)
				}
			}))
			defer srv.Close()
			d, err := vsExec(context.Background(), newClient(srv.URL, "k"), "sbx_1", []byte(`{}`), true)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("vsExec = %v, %v; want an error saying %q", d, err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d <= 0 || d >= gap {
				t.Errorf("vsExec = %v, want the time to the first bytes (the exit came %v after them)", d, gap)
			}
		})
	}
}
