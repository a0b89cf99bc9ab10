package sandbox

import "testing"

func TestDiskLabel(t *testing.T) {
	for _, tt := range []struct {
		bytes int64
		want  string
	}{{0, "the runtime's default disk"}, {64 << 20, "disk_mb 64"}} {
		if got := diskLabel(tt.bytes); got != tt.want {
			t.Errorf("diskLabel(%d): got %q, want %q", tt.bytes, got, tt.want)
		}
	}
}
