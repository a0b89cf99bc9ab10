package rest

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sandboxd/internal/api"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// execCalls are the exec requests the fake got and the cursors of its output subscriptions.
func execCalls(f *apitest.Fake) ([]sandbox.ExecRequest, []string) {
	var reqs []sandbox.ExecRequest
	var afters []string
	for _, c := range f.Calls() {
		switch c.Method {
		case "Exec":
			reqs = append(reqs, c.Exec)
		case "ExecOutput":
			afters = append(afters, c.After)
		}
	}
	return reqs, afters
}

// waitOutputs waits for one output subscription, then until every stream of the fake has
// ended (its subscription ended or cancelled).
func waitOutputs(t *testing.T, f *apitest.Fake, d time.Duration) {
	t.Helper()
	f.WaitSubscribed(t, d)
	f.WaitStreams(t, d)
}

// newTestHandler returns a handler over f that accepts apitest's keys.
func newTestHandler(t *testing.T, f api.Service) *Handler {
	t.Helper()
	return New(f, apitest.Authenticator(t), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
}

// sseEvent is one parsed Server-Sent Event (or comment, when Comment is set).
type sseEvent struct {
	ID, Event, Data, Comment string
}

// readEvents parses a stream until EOF or until stop returns true for an event.
func readEvents(t *testing.T, r io.Reader, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			out = append(out, cur)
			if stop != nil && stop(cur) {
				return out
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			cur.Comment = strings.TrimSpace(strings.TrimPrefix(line, ":"))
		default:
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				cur.ID = v
			case "event":
				cur.Event = v
			case "data":
				if cur.Data != "" {
					t.Errorf("event %q has two data lines, want one", cur.Event)
				}
				cur.Data = v
			default:
				t.Errorf("got line %q, want id, event, data or a comment", line)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return out
}

func newRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return req
}

// t1 is 54 ms after the fixtures' time.
var t1 = apitest.T0.Add(54 * time.Millisecond)
