package rest

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"sandboxd/internal/sandbox"
)

// TestBase64ChunkIsTheEncodersEvent: a binary chunk written straight into the buffer is byte
// for byte the event the JSON encoder writes for it.
func TestBase64ChunkIsTheEncodersEvent(t *testing.T) {
	big := bytes.Repeat([]byte{0, 1, 2, 0xff}, 16<<10)
	for _, tc := range []struct {
		name, id, stream string
		data             []byte
	}{
		{"nul", "12-0", "stdout", []byte{0}},
		{"binary", "99-0", "stderr", []byte{0xff, 0xfe, 'a', 0}},
		{"large", "65541-0", "stdout", big},
		{"noID", "", "stdout", []byte("\x00x")},
		{"oddStream", "7-0", "weird\"", []byte{0}},
		{"empty", "5-0", "stdout", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, got := recorded()
			if err := fast.base64Chunk(tc.id, tc.stream, tc.data); err != nil {
				t.Fatal(err)
			}
			slow, want := recorded()
			if err := slow.event(tc.id, "chunk", chunkOut{Stream: tc.stream, DataBase64: base64.StdEncoding.EncodeToString(tc.data)}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
				t.Fatalf("got %.200q, want %.200q", got.Body.Bytes(), want.Body.Bytes())
			}
		})
	}
	// execEvent picks it for output that is not text, and text stays text.
	s, out := recorded()
	if _, err := s.execEvent("sbx_1", sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "6-0", Stream: "stdout", Data: []byte{0}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.execEvent("sbx_1", sandbox.ExecEvent{Kind: sandbox.ExecChunk, Cursor: "12-0", Stream: "stdout", Data: []byte("hi\n")}); err != nil {
		t.Fatal(err)
	}
	want := "id: 6-0\nevent: chunk\ndata: {\"stream\":\"stdout\",\"data_base64\":\"AA==\"}\n\n" +
		"id: 12-0\nevent: chunk\ndata: {\"stream\":\"stdout\",\"data\":\"hi\\n\"}\n\n"
	if out.Body.String() != want {
		t.Fatalf("got %q, want %q", out.Body.String(), want)
	}
}

// recorded is an event stream into a recorder (no write deadlines: deadline does nothing).
func recorded() (*sse, *httptest.ResponseRecorder) {
	rec := httptest.NewRecorder()
	return &sse{w: rec, rc: http.NewResponseController(rec), timeout: time.Second}, rec
}
