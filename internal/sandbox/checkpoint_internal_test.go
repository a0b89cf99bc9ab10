package sandbox

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestBoundedExport: a guest's export of exactly its limit reads whole; one byte more fails,
// however it is read.
func TestBoundedExport(t *testing.T) {
	const limit = 1000
	for _, size := range []int{0, 999, 1000, 1001, 5000} {
		for _, chunk := range []int{1, 7, 512, 4096} {
			b := &boundedExport{ReadCloser: io.NopCloser(strings.NewReader(strings.Repeat("x", size))), left: limit + 1}
			buf := make([]byte, chunk)
			got, err := 0, error(nil)
			for {
				var n int
				n, err = b.Read(buf)
				got += n
				if err != nil {
					break
				}
			}
			if size <= limit && (err != io.EOF || got != size) {
				t.Errorf("size %d, chunks of %d: read %d, %v; want all of it and EOF", size, chunk, got, err)
			}
			if size > limit && !errors.Is(err, errExportTooLarge) {
				t.Errorf("size %d, chunks of %d: read %d, %v; want errExportTooLarge", size, chunk, got, err)
			}
		}
	}
	if exportLimit(0) != 20<<30+64<<20 || exportLimit(1<<30) != 2<<30+64<<20 {
		t.Errorf("exportLimit: %d %d", exportLimit(0), exportLimit(1<<30))
	}
}
