package apierror

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// A network error without a code (Redis restarting) is UNAVAILABLE with a Retry-After, not an
// internal error; any other uncoded error stays INTERNAL with the generic message.
func TestFromNetworkError(t *testing.T) {
	_, dialErr := net.Dial("unix", "/nonexistent/redis.sock")
	for _, tc := range []struct {
		name string
		err  error
		want Code
	}{
		{"dial", fmt.Errorf("store get sbx_1: %w", dialErr), Unavailable},
		{"plain", errors.New("boom"), Internal},
		{"coded", fmt.Errorf("x: %w", New(NotFound, "no")), NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := From(tc.err)
			if got.Code != tc.want {
				t.Fatalf("got %s, want %s", got.Code, tc.want)
			}
			if tc.want == Unavailable && (got.RetryAfter != time.Second || strings.Contains(got.Message, "sock")) {
				t.Errorf("got retry-after %s and message %q, want 1s and nothing of the cause", got.RetryAfter, got.Message)
			}
		})
	}
}
