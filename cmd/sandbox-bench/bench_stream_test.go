package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestReadSSE(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"events", "event: started\ndata: {}\n\nid: 1\nevent: chunk\ndata: {\"x\":1}\n\n", []string{"started {}", `chunk {"x":1}`}},
		{"crlf", "event: exit\r\ndata: 1\r\n\r\n", []string{"exit 1"}},
		{"comments", ": keepalive\n\nevent: a\ndata: 1\n\n", []string{"a 1"}},
		{"multiline", "data: 1\ndata: 2\n\n", []string{"message 1\n2"}},
		{"noSpace", "event:a\ndata:x\n\n", []string{"a x"}},
		{"noData", "event: a\n\n", nil},
		{"longLine", "event: a\ndata: " + long + "\n\n", []string{"a " + long}},
		{"unterminated", "event: a\ndata: 1\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			// A 16-byte buffer (bufio's minimum) makes the long line span several reads.
			err := readSSE(bufio.NewReaderSize(strings.NewReader(tc.in), 16), func(event string, data []byte) error {
				got = append(got, event+" "+string(data))
				return nil
			})
			if err != nil {
				t.Fatalf("readSSE: %v", err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReadSSEStopsOnError(t *testing.T) {
	stop := errors.New("stop")
	calls := 0
	err := readSSE(bufio.NewReader(strings.NewReader("data: 1\n\ndata: 2\n\n")), func(string, []byte) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("got error %v after %d calls, want %v after 1", err, calls, stop)
	}
}

func TestStreamRunCheck(t *testing.T) {
	ok := func() *streamRun {
		r := &streamRun{exited: true}
		if err := r.output("STDOUT", []byte("x\n"), 1); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name      string
		r         *streamRun
		wantBytes int64
		wantOut   string
		wantErr   bool
	}{
		{"ok", ok(), 2, "x\n", false},
		{"anyOutput", ok(), 2, "", false},
		{"short", ok(), 3, "", true},
		{"otherOutput", ok(), 2, "y\n", true},
		{"notExited", func() *streamRun { r := ok(); r.exited = false; return r }(), 2, "", true},
		{"exitCode", func() *streamRun { r := ok(); r.exit.ExitCode = 1; return r }(), 2, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.r.check(tc.wantBytes, tc.wantOut); (err != nil) != tc.wantErr {
				t.Errorf("check(%d, %q) = %v, want error %v", tc.wantBytes, tc.wantOut, err, tc.wantErr)
			}
		})
	}
	r := &streamRun{}
	if err := r.output("stdin", []byte("x"), 0); err == nil {
		t.Error("output of stream stdin: got no error, want one")
	}
	if err := r.output("stderr", []byte("e"), 5); err != nil || r.first != 0 || r.stdoutBytes != 0 || string(r.stderr) != "e" {
		t.Errorf("stderr output: got err %v, first %v, stdout bytes %d, stderr %q; want nil, 0, 0, \"e\"", err, r.first, r.stdoutBytes, r.stderr)
	}
}

func TestCPUTicks(t *testing.T) {
	got, err := cpuTicks(os.Getpid())
	if err != nil || got < 0 {
		t.Errorf("cpuTicks(self) = %d, %v; want >= 0, nil", got, err)
	}
	if _, err := cpuTicks(-1); err == nil {
		t.Error("cpuTicks(-1): got no error, want one")
	}
}

func TestIsRedisServer(t *testing.T) {
	for arg, want := range map[string]bool{
		"/usr/bin/redis-server unixsocket:/tmp/x/state/redis/redis.sock": true,
		"redis-server":       true,
		"/usr/bin/redis-cli": false,
		"runsc-sandbox":      false,
		"":                   false,
	} {
		if got := isRedisServer(arg); got != want {
			t.Errorf("isRedisServer(%q): got %v, want %v", arg, got, want)
		}
	}
}

func TestSplitBase64(t *testing.T) {
	for _, tc := range []struct{ in, rest, data string }{
		{`{"id":"1","type":"next","payload":{"data":{"execOutput":{"kind":"CHUNK","stream":"STDOUT","dataBase64":"aGVsbG8=","result":null}}}}`,
			`{"id":"1","type":"next","payload":{"data":{"execOutput":{"kind":"CHUNK","stream":"STDOUT","dataBase64":"","result":null}}}}`, "aGVsbG8="},
		{`{"type":"ping"}`, `{"type":"ping"}`, ""},
		{`{"dataBase64":"abc`, `{"dataBase64":"abc`, ""}, // no closing quote: left to encoding/json
	} {
		rest, data := splitBase64([]byte(tc.in), gqlDataKey)
		if string(rest) != tc.rest || string(data) != tc.data {
			t.Errorf("splitBase64(%s) = %s, %q; want %s, %q", tc.in, rest, data, tc.rest, tc.data)
		}
	}
}
