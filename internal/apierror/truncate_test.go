package apierror

import (
	"bytes"
	"strings"
	"testing"
)

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short", "abc", 64, "abc"},
		{"exact", "abcd", 4, "abcd"},
		{"ascii", strings.Repeat("x", 100), 10, strings.Repeat("x", 7) + "…"},
		// A cut never splits a rune (this case was execstream's utf8_boundary test).
		{"utf8_boundary", string(bytes.Repeat([]byte("é"), 200)), 11, "éééé…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Truncate(tc.in, tc.n)
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if len(got) > tc.n {
				t.Fatalf("got %d bytes, want at most %d", len(got), tc.n)
			}
		})
	}
}
