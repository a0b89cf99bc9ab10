package tarsafe_test

import (
	"errors"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/internal/tarsafe"
	"sandboxd/internal/tarsafe/tarsafetest"
)

// FuzzCleanName: CleanName and CleanDeepName never panic. CleanDeepName accepts exactly the
// local paths (filepath.IsLocal, or the root itself) without NUL whose clean form has no
// component over Linux's NAME_MAX; CleanName accepts exactly those of them within Linux's
// PATH_MAX, and refuses the others for their length alone. What either accepts is "." or
// relative, clean, without a ".." element, and a fixed point.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"a/b", "./a/b/", "./", ".", "a/../b", "/a", "../a", "a/../../b", "", "a\x00b",
		"..", "...", "a/..", "a//b", "//", "//x", "a/./../..", "\\..\\x", "a/b/../../..", strings.Repeat("x", 256),
		strings.Repeat("x", 255) + "/y", strings.Repeat("a/", 2049), "x/" + strings.Repeat("y", 256) + "/..", "../",
		".../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, n string) {
		deepWant := !strings.Contains(n, "\x00") && (filepath.IsLocal(n) || (n != "" && !path.IsAbs(n) && path.Clean(n) == "."))
		if deepWant {
			for part := range strings.SplitSeq(path.Clean(n), "/") {
				deepWant = deepWant && len(part) <= tarsafe.MaxComponentBytes
			}
		}
		want := deepWant && len(n) <= tarsafe.MaxPathBytes
		for _, rule := range []struct {
			name  string
			clean func(string) (string, error)
			want  bool
		}{{"CleanName", tarsafe.CleanName, want}, {"CleanDeepName", tarsafe.CleanDeepName, deepWant}} {
			c, err := rule.clean(n)
			if (err == nil) != rule.want {
				t.Fatalf("%s(%q): got %q, refusal %v; want accepted %v", rule.name, n, c, err, rule.want)
			}
			if err != nil {
				if c != "" {
					t.Fatalf("%s(%q): refused (%v) but returned %q", rule.name, n, err, c)
				}
				continue
			}
			tarsafetest.CheckCleanName(t, n, c)
			if c2, err2 := rule.clean(c); err2 != nil || c2 != c {
				t.Fatalf("%s(%q) = %q, but %s(%q) = %q, %v", rule.name, n, c, rule.name, c, c2, err2)
			}
		}
		if _, err := tarsafe.CleanName(n); deepWant && !want && !errors.Is(err, tarsafe.ErrNameTooLong) {
			t.Fatalf("CleanName(%.40q…) of %d bytes: got %v, want %v", n, len(n), err, tarsafe.ErrNameTooLong)
		}
	})
}
