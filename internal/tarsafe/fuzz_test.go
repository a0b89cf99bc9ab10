package tarsafe_test

import (
	"path"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/internal/tarsafe"
	"sandboxd/internal/tarsafe/tarsafetest"
)

// FuzzCleanName: CleanName never panics, accepts exactly the local paths (filepath.IsLocal,
// the root included) without NUL within Linux's length limits, and what it accepts is "." or
// relative, clean, without a ".." element, and a fixed point.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"a/b", "./a/b/", "./", ".", "a/../b", "/a", "../a", "a/../../b", "", "a\x00b",
		"..", "a/..", "a//b", "//x", "a/./../..", strings.Repeat("x", 256), strings.Repeat("x", 255) + "/y",
		strings.Repeat("a/", 2049), "x/" + strings.Repeat("y", 256) + "/..", "../", ".../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, n string) {
		c, err := tarsafe.CleanName(n)
		want := n != "" && !strings.Contains(n, "\x00") && len(n) <= tarsafe.MaxPathBytes && filepath.IsLocal(n)
		if want {
			for part := range strings.SplitSeq(path.Clean(n), "/") {
				want = want && len(part) <= tarsafe.MaxComponentBytes
			}
		}
		if (err == nil) != want {
			t.Fatalf("CleanName(%q): got %q, refusal %v; want accepted %v", n, c, err, want)
		}
		if err != nil {
			if c != "" {
				t.Fatalf("CleanName(%q): refused (%v) but returned %q", n, err, c)
			}
			return
		}
		tarsafetest.CheckCleanName(t, n, c)
		if c2, err2 := tarsafe.CleanName(c); err2 != nil || c2 != c {
			t.Fatalf("CleanName(%q) = %q, but CleanName(%q) = %q, %v", n, c, c, c2, err2)
		}
	})
}
