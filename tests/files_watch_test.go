package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"sandboxd/internal/redistest"
	"sandboxd/tests/e2e"
)

// fileEvent is one watch event, from REST SSE or GraphQL, in one shape.
type fileEvent struct {
	Cursor, Kind, Path, From string
	IsDir                    bool
	Missed                   int64
	Reason                   string
	Code, Message            string // ERROR (GraphQL) or the SSE "error" event
}

func (e fileEvent) String() string {
	s := e.Cursor + " " + e.Kind + " " + e.Path
	if e.From != "" {
		s += " (from " + e.From + ")"
	}
	if e.Reason != "" || e.Code != "" {
		s += fmt.Sprintf(" [%s%s missed %d %s]", e.Reason, e.Code, e.Missed, e.Message)
	}
	return s
}

// seq is the sequence part of a watch cursor (<watch>.<seq>).
func seq(t *testing.T, cursor string) int {
	t.Helper()
	_, n, ok := strings.Cut(cursor, ".")
	v, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Fatalf("cursor %q is not <watch>.<seq>", cursor)
	}
	return v
}

// ---- REST SSE ----

// restWatch is GET …/files/watch as curl -N reads it.
type restWatch struct {
	status int
	body   []byte // the error answer when status is not 200
	events chan fileEvent
	stop   func()
}

func openRESTWatch(t *testing.T, s *e2e.Server, id, path string, q []string, headers ...string) *restWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+fileURL(id, "watch", path, q...), nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := s.HTTPClient().Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET …/files/watch: %v", err)
	}
	w := &restWatch{status: resp.StatusCode, events: make(chan fileEvent, 1024)}
	if resp.StatusCode != http.StatusOK {
		w.body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		close(w.events)
		w.stop = func() {}
		return w
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("GET …/files/watch: got Content-Type %q", ct)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(w.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var id, name, data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && name != "":
				ev := fileEvent{Cursor: id, Kind: strings.ToUpper(name)}
				var d struct {
					Path, From, Reason, Code, Message string
					IsDir                             bool  `json:"is_dir"`
					Missed                            int64 `json:"missed"`
				}
				if err := json.Unmarshal([]byte(data), &d); err != nil {
					ev.Kind, ev.Message = "UNDECODABLE", data
				}
				ev.Path, ev.From, ev.IsDir, ev.Missed, ev.Reason, ev.Code, ev.Message = d.Path, d.From, d.IsDir, d.Missed, d.Reason, d.Code, d.Message
				select {
				case w.events <- ev:
				case <-ctx.Done():
					return
				}
				id, name, data = "", "", ""
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	w.stop = func() {
		cancel()
		resp.Body.Close()
		<-done
	}
	t.Cleanup(w.stop)
	return w
}

// ---- GraphQL over graphql-transport-ws ----

const watchFilesSub = `subscription($s: ID!, $p: String!, $r: Boolean, $a: String) {
	watchFiles(sandboxId: $s, path: $p, recursive: $r, after: $a) { cursor kind path from isDir at missedEvents reason code message } }`

// gqlWatch subscribes to watchFiles on a WebSocket of its own.
type gqlWatch struct {
	events chan fileEvent
	errs   chan string // a GraphQL error's code at subscribe time
	stop   func()
}

func openGQLWatch(t *testing.T, s *e2e.Server, key string, vars map[string]any) *gqlWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := dialGraphQL(ctx, t, s)
	send(ctx, t, c, wsMsg{Type: "connection_init", Payload: rawJSON(t, map[string]any{"X-Api-Key": key})})
	if m := nextMsg(ctx, t, c); m.Type != "connection_ack" {
		t.Fatalf("got %s, want connection_ack", m.Type)
	}
	send(ctx, t, c, wsMsg{ID: "1", Type: "subscribe", Payload: rawJSON(t, map[string]any{"query": watchFilesSub, "variables": vars})})
	w := &gqlWatch{events: make(chan fileEvent, 1024), errs: make(chan string, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(w.events)
		for {
			var m wsMsg
			_, b, err := c.Read(ctx)
			if err != nil || json.Unmarshal(b, &m) != nil {
				return
			}
			switch m.Type {
			case "ping":
				_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"pong"}`))
			case "complete":
				return
			case "error", "next":
				var p struct {
					Data struct {
						WatchFiles *struct {
							Cursor, Kind                      string
							Path, From, Reason, Code, Message *string
							IsDir                             bool
							MissedEvents                      *int64
						}
					}
					Errors []e2e.GQLError
				}
				var errs []e2e.GQLError
				if m.Type == "error" {
					_ = json.Unmarshal(m.Payload, &errs)
				} else if json.Unmarshal(m.Payload, &p) == nil {
					errs = p.Errors
				}
				if len(errs) > 0 {
					w.errs <- errs[0].Code()
					return
				}
				f := p.Data.WatchFiles
				if f == nil {
					continue
				}
				str := func(s *string) string {
					if s == nil {
						return ""
					}
					return *s
				}
				ev := fileEvent{Cursor: f.Cursor, Kind: f.Kind, Path: str(f.Path), From: str(f.From), IsDir: f.IsDir,
					Reason: str(f.Reason), Code: str(f.Code), Message: str(f.Message)}
				if f.MissedEvents != nil {
					ev.Missed = *f.MissedEvents
				}
				select {
				case w.events <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	w.stop = func() {
		cancel()
		c.CloseNow()
		<-done
	}
	t.Cleanup(w.stop)
	return w
}

// collect reads events until done says so, failing after d.
func collect(t *testing.T, ch <-chan fileEvent, d time.Duration, done func([]fileEvent) bool) []fileEvent {
	t.Helper()
	var got []fileEvent
	timeout := time.After(d)
	for !done(got) {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the stream ended after %v", got)
			}
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("after %v got %v, want more", d, got)
		}
	}
	return got
}

func hasEvent(evs []fileEvent, kind, path, from string) bool {
	for _, e := range evs {
		if e.Kind == kind && e.Path == path && e.From == from {
			return true
		}
	}
	return false
}

// synced makes a marker folder in the watched folder until the watch reports it: the watch
// exists from then on (a GraphQL subscription has no acknowledgement of its own). Each try is
// one synchronous command, so nothing of it is still on its way once the marker is seen.
func synced(t *testing.T, s *e2e.Server, id, dir, h string, ch <-chan fileEvent) []fileEvent {
	t.Helper()
	var got []fileEvent
	for range 30 {
		sh(t, s, id, "rm -rf "+dir+"/.sync && mkdir "+dir+"/.sync", h)
		timeout := time.After(time.Second)
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatalf("the stream ended after %v", got)
				}
				got = append(got, ev)
				if ev.Kind == "CREATED" && strings.HasSuffix(ev.Path, "/.sync") {
					return got
				}
				continue
			case <-timeout:
			}
			break
		}
	}
	t.Fatalf("the watch never reported %s/.sync: %v", dir, got)
	return nil
}

// watchScript makes the changes every watch test looks for, in /workspace/proj.
const watchScript = `cd /workspace/proj
echo hi > src/a.txt
echo more >> src/a.txt
mv src/a.txt src/b.txt
mkdir -p new/deep && echo n > new/deep/n.txt
rm src/b.txt`

var watchWant = []struct{ kind, path, from string }{
	{"CREATED", "proj/src/a.txt", ""},
	{"MODIFIED", "proj/src/a.txt", ""},
	{"MOVED", "proj/src/b.txt", "proj/src/a.txt"},
	{"CREATED", "proj/new", ""},
	{"CREATED", "proj/new/deep/n.txt", ""},
	{"DELETED", "proj/src/b.txt", ""},
}

func sawAll(evs []fileEvent) bool {
	for _, w := range watchWant {
		if !hasEvent(evs, w.kind, w.path, w.from) {
			return false
		}
	}
	return true
}

// TestFileWatch: a recursive watch over graphql-transport-ws and over REST SSE sees what
// commands in the sandbox do; a client that left resumes from its cursor on another replica
// with nothing lost; a reader that comes back later than the watch keeps events is told so
// (OVERFLOW); a watch whose folder is deleted ends with an error, never silently.
func TestFileWatch(t *testing.T) {
	rs := redistest.Start(t)
	reps := e2e.ReplicasWith(t, e2e.ServerOptions{RedisURL: rs.URL, Limits: map[string]any{
		"watch_max_events": 32, "watch_max_per_sandbox": 4, "watch_max_dirs": 100}}, 2)
	a, b := reps[0], reps[1]
	h := e2e.HdrTenant1
	id := a.Create(t, e2e.CreateBody, h).SandboxID
	sh(t, a, id, "mkdir -p /workspace/proj/src && ln -s /tmp /workspace/proj/tmplink && mkdir -p /tmp/elsewhere", h)

	var resumeFrom string
	e2e.Step(t, "graphql-transport-ws", func(t *testing.T) {
		w := openGQLWatch(t, a, e2e.KeyTenant1, map[string]any{"s": id, "p": "proj", "r": true})
		synced(t, a, id, "/workspace/proj", h, w.events)
		sh(t, a, id, watchScript+"\ntouch /tmp/elsewhere/not-watched /workspace/proj/tmplink/elsewhere/through-link", h)
		got := collect(t, w.events, 30*time.Second, sawAll)
		for i := 1; i < len(got); i++ {
			if seq(t, got[i].Cursor) != seq(t, got[i-1].Cursor)+1 {
				t.Errorf("event %v follows %v: a gap", got[i], got[i-1])
			}
		}
		for _, e := range got {
			if strings.Contains(e.Path, "not-watched") || strings.Contains(e.Path, "through-link") || strings.Contains(e.Path, ".sbx-") {
				t.Errorf("reported %v: outside the tree, through a link, or the server's own", e)
			}
		}
		resumeFrom = got[len(got)-1].Cursor
		w.stop()
	})

	e2e.Step(t, "resume-on-another-replica-over-rest-sse", func(t *testing.T) {
		sh(t, a, id, "cd /workspace/proj && mkdir later && mv later later2 && rmdir later2", h)
		// curl -N -H "Last-Event-ID: $CURSOR" "$URL/…/$ID/files/watch?path=proj&recursive=true"
		w := openRESTWatch(t, b, id, "proj", []string{"recursive", "true"}, h, "Last-Event-ID: "+resumeFrom)
		if w.status != http.StatusOK {
			t.Fatalf("got %d %s", w.status, w.body)
		}
		got := collect(t, w.events, 30*time.Second, func(evs []fileEvent) bool { return len(evs) == 3 })
		want := []struct{ kind, path, from string }{{"CREATED", "proj/later", ""}, {"MOVED", "proj/later2", "proj/later"}, {"DELETED", "proj/later2", ""}}
		for i, wt := range want {
			g := got[i]
			if g.Kind != wt.kind || g.Path != wt.path || g.From != wt.from || seq(t, g.Cursor) != seq(t, resumeFrom)+i+1 {
				t.Errorf("event %d after %s: got %v, want %s %s (from %q), nothing lost", i, resumeFrom, g, wt.kind, wt.path, wt.from)
			}
		}
		resumeFrom = got[2].Cursor
		w.stop()
	})

	e2e.Step(t, "overflow", func(t *testing.T) {
		// 100 events while nobody reads, in a watch that keeps 32.
		sh(t, a, id, "cd /workspace/proj && for i in $(seq 50); do mkdir f$i; done && for i in $(seq 50); do rmdir f$i; done", h)
		w := openRESTWatch(t, a, id, "proj", []string{"recursive", "true", "after", resumeFrom}, h)
		if w.status != http.StatusOK {
			t.Fatalf("got %d %s", w.status, w.body)
		}
		got := collect(t, w.events, 30*time.Second, func(evs []fileEvent) bool {
			return len(evs) > 0 && evs[len(evs)-1].Path == "proj/f50" && evs[len(evs)-1].Kind == "DELETED"
		})
		o := got[0]
		if o.Kind != "OVERFLOW" || o.Reason != "RING" || o.Missed != 68 || seq(t, o.Cursor) != seq(t, resumeFrom)+68 {
			t.Errorf("first event: got %v, want OVERFLOW (RING) of the 68 events the watch no longer keeps", o)
		}
		if len(got) != 33 {
			t.Errorf("got %d events, want the overflow and the 32 kept: %v", len(got), got)
		}
		w.stop()
	})

	e2e.Step(t, "sse-new-watch-and-its-end", func(t *testing.T) {
		w := openRESTWatch(t, b, id, "proj/new", nil, h)
		if w.status != http.StatusOK {
			t.Fatalf("got %d %s", w.status, w.body)
		}
		synced(t, b, id, "/workspace/proj/new", h, w.events)
		sh(t, b, id, "cd /workspace/proj/new && echo x > f && mv f g && rm -rf /workspace/proj/new", h)
		got := collect(t, w.events, 30*time.Second, func(evs []fileEvent) bool {
			return len(evs) > 0 && evs[len(evs)-1].Kind == "ERROR"
		})
		if end := got[len(got)-1]; end.Code != "NOT_FOUND" || !strings.Contains(end.Message, "deleted") {
			t.Errorf("the last event: got %v, want an error NOT_FOUND (the folder was deleted)", end)
		}
		for _, wt := range []struct{ kind, path, from string }{{"CREATED", "proj/new/f", ""}, {"MOVED", "proj/new/g", "proj/new/f"}} {
			if !hasEvent(got, wt.kind, wt.path, wt.from) {
				t.Errorf("got %v, want %s %s", got, wt.kind, wt.path)
			}
		}
		if _, ok := <-w.events; ok {
			t.Error("the stream went on after its error")
		}
	})

	e2e.Step(t, "refusals", func(t *testing.T) {
		sh(t, a, id, "mkdir -p /workspace/wide && cd /workspace/wide && for i in $(seq 120); do mkdir d$i; done", h)
		for _, tc := range []struct {
			path   string
			q      []string
			hdr    string
			status int
			code   string
		}{
			{"proj/tmplink", nil, h, http.StatusBadRequest, "INVALID_ARGUMENT"},                   // a link out of the workspace
			{"proj/tmplink/elsewhere", nil, h, http.StatusBadRequest, "INVALID_ARGUMENT"},         // through it
			{"/etc", nil, h, http.StatusBadRequest, "INVALID_ARGUMENT"},                           // outside
			{"wide", []string{"recursive", "true"}, h, http.StatusBadRequest, "INVALID_ARGUMENT"}, // 121 > watch_max_dirs
			{"proj", []string{"after", "w0123456789abcdef.5"}, h, http.StatusGone, "CURSOR_EXPIRED"},
			{"proj", []string{"after", "not-a-cursor"}, h, http.StatusBadRequest, "INVALID_ARGUMENT"},
			{"proj", []string{"after", resumeFrom}, h, http.StatusBadRequest, "INVALID_ARGUMENT"}, // not recursive: another watch's cursor
			{"proj", nil, e2e.HdrTenant2, http.StatusNotFound, "NOT_FOUND"},
		} {
			w := openRESTWatch(t, a, id, tc.path, tc.q, tc.hdr)
			r := &e2e.Response{Status: w.status, Body: w.body, Header: http.Header{"Content-Type": {"application/json"}},
				Request: "GET watch " + tc.path + " " + strings.Join(tc.q, "=")}
			r.WantError(t, tc.status, tc.code)
		}
		g := openGQLWatch(t, a, e2e.KeyTenant2, map[string]any{"s": id, "p": "proj"})
		select {
		case code := <-g.errs:
			if code != "NOT_FOUND" {
				t.Errorf("another tenant's watchFiles: got %s, want NOT_FOUND", code)
			}
		case <-time.After(30 * time.Second):
			t.Error("another tenant's watchFiles: no error")
		}
		// At most watch_max_per_sandbox (4) watches at once: the earlier ones of this test
		// expire only after their grace period, so open new ones until the limit answers.
		var last *restWatch
		for range 5 {
			last = openRESTWatch(t, a, id, "proj", nil, h)
			if last.status != http.StatusOK {
				break
			}
		}
		r := &e2e.Response{Status: last.status, Body: last.body, Header: http.Header{"Content-Type": {"application/json"}}, Request: "GET watch"}
		r.WantError(t, http.StatusTooManyRequests, "LIMIT_EXCEEDED", "watches")
	})

	e2e.Step(t, "restart-expires-the-cursor", func(t *testing.T) {
		a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, h).Want(t, http.StatusOK)
		a.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, h).Want(t, http.StatusOK)
		w := openRESTWatch(t, b, id, "proj", []string{"recursive", "true", "after", resumeFrom}, h)
		r := &e2e.Response{Status: w.status, Body: w.body, Header: http.Header{"Content-Type": {"application/json"}}, Request: "GET watch after a restart"}
		r.WantError(t, http.StatusGone, "CURSOR_EXPIRED")
		g := openGQLWatch(t, a, e2e.KeyTenant1, map[string]any{"s": id, "p": "proj", "r": true, "a": resumeFrom})
		select {
		case code := <-g.errs:
			if code != "CURSOR_EXPIRED" {
				t.Errorf("watchFiles after a restart: got %s, want CURSOR_EXPIRED", code)
			}
		case <-time.After(30 * time.Second):
			t.Error("watchFiles after a restart: no error")
		}
	})
}

// TestFileWatchStopEndsStream: a watch whose sandbox stops ends with an ERROR event
// (INVALID_STATE), over GraphQL; and a flood of changes with a slow reader is bounded: the
// reader gets an OVERFLOW, never an unbounded backlog.
func TestFileWatchStopEndsStream(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{Limits: map[string]any{"watch_max_events": 256}})
	h := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, h).SandboxID
	sh(t, s, id, "mkdir -p /workspace/flood", h)

	w := openGQLWatch(t, s, e2e.KeyTenant1, map[string]any{"s": id, "p": "flood"})
	first := synced(t, s, id, "/workspace/flood", h, w.events)
	// The reader stops reading: 20,000 events pile up in the sandbox, not in the server.
	sh(t, s, id, "cd /workspace/flood && python3 -c 'import os\nfor i in range(10000):\n  os.mkdir(\"d%d\" % i)\nfor i in range(10000):\n  os.rmdir(\"d%d\" % i)'", h)
	w.stop()
	r := openRESTWatch(t, s, id, "flood", []string{"after", first[len(first)-1].Cursor}, h)
	got := collect(t, r.events, 60*time.Second, func(evs []fileEvent) bool {
		return len(evs) > 0 && evs[len(evs)-1].Path == "flood/d9999" && evs[len(evs)-1].Kind == "DELETED"
	})
	t.Logf("after a flood of 20,000 events: %v, then %d events", got[0], len(got)-1)
	if got[0].Kind != "OVERFLOW" || got[0].Missed < 19000 || len(got) > 257 {
		t.Errorf("after a flood of 20,000: got %d events starting with %v, want an OVERFLOW and at most the 256 kept", len(got), got[0])
	}
	r.stop()

	g := openGQLWatch(t, s, e2e.KeyTenant1, map[string]any{"s": id, "p": "flood"})
	synced(t, s, id, "/workspace/flood", h, g.events)
	s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, h).Want(t, http.StatusOK)
	end := collect(t, g.events, 60*time.Second, func(evs []fileEvent) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == "ERROR"
	})
	if e := end[len(end)-1]; e.Code != "INVALID_STATE" {
		t.Errorf("after the stop: got %v, want an ERROR event with INVALID_STATE", e)
	}
	if _, ok := <-g.events; ok {
		t.Error("the subscription went on after its ERROR event")
	}
}
