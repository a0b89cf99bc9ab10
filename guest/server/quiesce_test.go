package server

import (
	"slices"
	"strings"
	"testing"
)

func TestParseBound(t *testing.T) {
	table := `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 11 @sbx-init
0000000000000000: 00000003 00000000 00000000 0001 03 12
0000000000000000: 00000001 00000000 00010000 0001 01 13 /workspace/app.sock
0000000000000000: 00000001 00000000 00010000 0001 01 14 /workspace/deep/dir/with space.sock
0000000000000000: 00000001 00000000 00010000 0001 01 15 /workspaces/other.sock
0000000000000000: 00000001 00000000 00010000 0001 01 16 /tmp/ok.sock
0000000000000000: 00000001 00000000 00010000 0001 01 17 /workspace
`
	got, err := parseBound(strings.NewReader(table), "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/workspace/app.sock", "/workspace/deep/dir/with space.sock", "/workspace"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	// A table whose lines are far too long is an error, not a hang or a guess.
	if _, err := parseBound(strings.NewReader("h\n"+strings.Repeat("x", 64<<10)+"\n"), "/workspace"); err == nil {
		t.Fatal("an oversize line: got no error")
	}
}
