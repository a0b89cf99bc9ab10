package server

import (
	"bytes"
	"crypto/rand"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestExportCompressed: ?compress=zstd gives the same tar, zstd-compressed within
// ExportWindow (a decoder that allows no more reads it), and far smaller for text; without
// it the tar goes as it is.
func TestExportCompressed(t *testing.T) {
	ws := t.TempDir()
	for i := range 40 {
		data := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 1000))
		if i%4 == 0 {
			data = make([]byte, 30000)
			_, _ = rand.Read(data)
		}
		if err := os.WriteFile(filepath.Join(ws, "f"+string(rune('a'+i%26))+string(rune('0'+i/26))), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{ws: ws, log: slog.New(slog.DiscardHandler)}
	plain := httptest.NewRecorder()
	s.handleExport(plain, httptest.NewRequest(http.MethodGet, "/v1/workspace/tar", nil))
	z := httptest.NewRecorder()
	s.handleExport(z, httptest.NewRequest(http.MethodGet, "/v1/workspace/tar?compress=zstd", nil))
	if plain.Code != http.StatusOK || z.Code != http.StatusOK {
		t.Fatalf("status %d, %d", plain.Code, z.Code)
	}
	if enc := plain.Header().Get("Content-Encoding"); enc != "" {
		t.Errorf("plain export's encoding %q", enc)
	}
	if enc := z.Header().Get("Content-Encoding"); enc != "zstd" {
		t.Fatalf("compressed export's encoding %q, want zstd", enc)
	}
	dec, err := zstd.NewReader(bytes.NewReader(z.Body.Bytes()), zstd.WithDecoderMaxWindow(ExportWindow))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(dec); err != nil {
		t.Fatalf("decoding within the export's window: %v", err)
	}
	if !bytes.Equal(got.Bytes(), plain.Body.Bytes()) {
		t.Errorf("the decompressed export differs from the plain one (%d against %d bytes)", got.Len(), plain.Body.Len())
	}
	if z.Body.Len()*2 > plain.Body.Len() {
		t.Errorf("compressed %d bytes of %d: want far fewer", z.Body.Len(), plain.Body.Len())
	}
	if z.Header().Get("X-Sbx-Files") != plain.Header().Get("X-Sbx-Files") || plain.Header().Get("X-Sbx-Files") == "" {
		t.Errorf("entry counts %q, %q", z.Header().Get("X-Sbx-Files"), plain.Header().Get("X-Sbx-Files"))
	}
}
