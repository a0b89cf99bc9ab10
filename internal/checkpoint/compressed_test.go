package checkpoint_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"

	"sandboxd/internal/checkpoint"
)

// zstdOf compresses b as a workspace reader does (one stream, a 1 MiB window, several
// goroutines).
func zstdOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2), zstd.WithWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestSaveCompressed: a compressed tar is stored as it came (the object is its bytes) and
// reads back as the tar, with its raw size; a stream that does not decode whole (garbage, cut
// inside a frame, garbage after a valid stream), a tar over the bound, and a stream whose
// producer failed are refused and leave nothing.
func TestSaveCompressed(t *testing.T) {
	var big bytes.Buffer
	if _, err := writeTar(&big, 21, 0, 3<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	tarball := big.Bytes()
	z := zstdOf(t, tarball)

	st, _ := newStore(t, checkpoint.Options{})
	sc := newScope()
	m, err := st.SaveCompressed(t.Context(), sc, bytes.NewReader(z), "", int64(len(tarball)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Size != int64(len(z)) || m.RawSize != int64(len(tarball)) || m.SHA256 != fmt.Sprintf("%x", sha256.Sum256(z)) {
		t.Errorf("manifest %+v, want the compressed stream's own size and hash and the tar's size %d", m, len(tarball))
	}
	if sum, err := readBack(t, st, sc, m.ID); err != nil || sum != sha256.Sum256(tarball) {
		t.Errorf("reading it back: %v (the same tar: %v)", err, sum == sha256.Sum256(tarball))
	}

	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name string
		r    io.Reader
		max  int64
	}{
		{"Garbage", bytes.NewReader(bytes.Repeat([]byte("not zstd"), 1000)), 1 << 30},
		{"CutInsideAFrame", bytes.NewReader(z[:len(z)/2]), 1 << 30},
		{"GarbageAfter", io.MultiReader(bytes.NewReader(z), bytes.NewReader([]byte("trailing"))), 1 << 30},
		{"OverTheBound", bytes.NewReader(z), int64(len(tarball)) - 1},
		{"ProducerFailed", io.MultiReader(bytes.NewReader(z), errReader{errBoom}), 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, objs := newStore(t, checkpoint.Options{})
			sc := newScope()
			if _, err := st.SaveCompressed(t.Context(), sc, tc.r, "", tc.max); err == nil {
				t.Fatal("SaveCompressed succeeded")
			} else {
				t.Logf("refused: %v", err)
			}
			if got := objectKeys(t, objs); len(got) != 0 {
				t.Errorf("objects after a refused SaveCompressed = %q, want none", got)
			}
		})
	}
}
