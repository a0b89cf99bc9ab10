// Package tarsafetest is test-only: checks of what tarsafe's name rule promises, for the fuzz
// targets of the packages that clean names with it or after it.
package tarsafetest

import (
	"path"
	"strings"
	"testing"
)

// CheckCleanName fails t unless c, accepted for n, is "." or a clean relative path without
// "..".
func CheckCleanName(t testing.TB, n, c string) {
	t.Helper()
	if c == "." {
		return
	}
	if c == "" || strings.HasPrefix(c, "/") || path.Clean(c) != c || strings.Contains(c, "\x00") {
		t.Fatalf("%q: accepted as %q, which is not a clean relative path", n, c)
	}
	for part := range strings.SplitSeq(c, "/") {
		if part == ".." || part == "." || part == "" {
			t.Fatalf("%q: accepted as %q, which has the element %q", n, c, part)
		}
	}
}
