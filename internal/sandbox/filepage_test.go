package sandbox

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestFileCursor: a cursor round-trips any name a folder can hold, and anything that is not
// one name (a path, dots, NUL, too long, another kind of cursor, bad base64) is refused.
func TestFileCursor(t *testing.T) {
	for _, name := range []string{"a", "f00001-x", "with space", "ünï", "\xff\xfe", strings.Repeat("n", 255), "...", ".hidden"} {
		got, ok := parseFileCursor(FileCursor(name))
		if !ok || got != name {
			t.Errorf("parseFileCursor(FileCursor(%q)): got %q, %v, want the name back", name, got, ok)
		}
	}
	enc := func(s string) string { return fileCursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(s)) }
	bad := []struct{ name, cursor string }{
		{"empty-name", fileCursorPrefix},
		{"parent", enc("..")},
		{"dot", enc(".")},
		{"path", enc("../../etc/passwd")},
		{"slash", enc("a/b")},
		{"absolute", enc("/etc")},
		{"nul", enc("a\x00b")},
		{"too-long", enc(strings.Repeat("n", 256))},
		{"no-prefix", base64.RawURLEncoding.EncodeToString([]byte("a"))},
		{"other-version", "f2." + base64.RawURLEncoding.EncodeToString([]byte("a"))},
		{"snapshot-cursor", "1700000000000000000.snap_x"},
		{"std-base64", fileCursorPrefix + "YQ=="},
		{"not-base64", fileCursorPrefix + "!!!"},
		{"huge", fileCursorPrefix + strings.Repeat("A", 10000)},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if got, ok := parseFileCursor(tt.cursor); ok {
				t.Errorf("parseFileCursor(%q): got %q, want refused", tt.cursor, got)
			}
		})
	}
}
