package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"sandboxd/guest/proto"
)

func TestRouteOf(t *testing.T) {
	for p, want := range map[string][2]string{
		"/v1/execs":                 {"/v1/execs", ""},
		"/v1/execs/exec_1":          {"/v1/execs/{id}", "exec_1"},
		"/v1/execs/exec_1/log":      {"/v1/execs/{id}/log", "exec_1"},
		"/v1/watches/w_1/events":    {"/v1/watches/{id}/events", ""},
		"/v1/files":                 {"/v1/files", ""},
		"/v1/workspace/tar":         {"/v1/workspace/tar", ""},
		"/v1/execs/a%2Fb/signal":    {"/v1/execs/{id}/signal", "a%2Fb"},
		"/v1/health":                {"/v1/health", ""},
		"/v1/execs/exec_2/stdin/xx": {"/v1/execs/{id}/stdin/xx", "exec_2"},
	} {
		route, id := routeOf(p)
		if route != want[0] || id != want[1] {
			t.Errorf("routeOf(%q) = %q, %q, want %q, %q", p, route, id, want[0], want[1])
		}
	}
}

// The guest runs inside the sandbox: only the protocol's codes become a span's code, so a
// workload that got hold of the guest cannot write what it likes into the trace.
func TestCallCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&proto.Error{Code: proto.ErrCodeNotFound, Message: "tenant-secret"}, "NOT_FOUND"},
		{&proto.Error{Code: proto.ErrCodeNoSpace}, "NO_SPACE"},
		{&proto.Error{Code: "Robert'); DROP"}, "INTERNAL"},
		{&proto.Error{Code: strings.Repeat("a", 33)}, "INTERNAL"},
		{&proto.Error{Code: "evil\ncode"}, "INTERNAL"},
		{fmt.Errorf("%w: reset", ErrClosed), "CLOSED"},
		{fmt.Errorf("guest: %w", context.Canceled), "CANCELED"},
		{context.DeadlineExceeded, "DEADLINE_EXCEEDED"},
		{errors.New("other"), "INTERNAL"},
	} {
		if got := callCode(tc.err); got != tc.want {
			t.Errorf("callCode(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
