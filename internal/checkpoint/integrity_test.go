package checkpoint_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"sandboxd/internal/checkpoint"
)

// flip inverts the byte at off (from the end when negative) of the local file of key.
func flip(t *testing.T, objs *checkpoint.LocalStore, key string, off int64) {
	t.Helper()
	path, err := objs.Path(key)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off += fi.Size()
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptObject(t *testing.T) {
	tarball, _ := smallTar(t, 5)
	for _, tc := range []struct {
		name string
		off  int64 // from the end when negative
	}{
		{"MagicNumber", 0},
		{"FrameHeader", 5},
		{"Early", 100},
		{"Middle", -1 << 62}, // replaced below by the middle
		{"ChecksumTrailer", -1},
		{"LastBlock", -10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, objs := newStore(t, checkpoint.Options{})
			sc := newScope()
			m := save(t, st, sc, tarball, "")
			off := tc.off
			if off == -1<<62 {
				off = m.Size / 2
			}
			flip(t, objs, m.Object, off)
			if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
			if _, err := st.Verify(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Verify: got %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestTruncatedObject(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 6)
	m := save(t, st, sc, tarball, "")
	path, _ := objs.Path(m.Object)
	if err := os.Truncate(path, m.Size/2); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("reading: got %v, want ErrCorrupt", err)
	}
	if _, err := st.Verify(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("Verify: got %v, want ErrCorrupt", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("reading without a data object: got %v, want ErrCorrupt", err)
	}
}

// shortReads is an ObjectStore whose Get reports the full size but ends the data early
// (as a broken connection or a store without sizes might).
type shortReads struct{ checkpoint.ObjectStore }

func (s shortReads) Get(ctx context.Context, key string) (io.ReadCloser, checkpoint.ObjectAttrs, error) {
	rc, a, err := s.ObjectStore.Get(ctx, key)
	if err != nil || !strings.HasSuffix(key, ".tar.zst") {
		return rc, a, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, a.Size-1), rc}, a, nil
}

// longReads is an ObjectStore whose Get returns extra bytes after the data.
type longReads struct{ checkpoint.ObjectStore }

func (s longReads) Get(ctx context.Context, key string) (io.ReadCloser, checkpoint.ObjectAttrs, error) {
	rc, a, err := s.ObjectStore.Get(ctx, key)
	if err != nil || !strings.HasSuffix(key, ".tar.zst") {
		return rc, a, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(rc, strings.NewReader("trailing")), rc}, a, nil
}

func TestStreamChecksAtEOF(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 7)
	m := save(t, st, sc, tarball, "")
	for name, o := range map[string]checkpoint.ObjectStore{"Short": shortReads{objs}, "Long": longReads{objs}} {
		t.Run(name, func(t *testing.T) {
			if _, err := readBack(t, checkpoint.New(o, checkpoint.Options{}), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
		})
	}
	// A valid zstd stream that is not the one the manifest describes.
	key := strings.TrimSuffix(m.Object, ".tar.zst") + ".json"
	for _, tc := range []struct {
		name       string
		edit       func(*checkpoint.Manifest)
		verifyFail bool // Verify checks only the stored bytes, not the tar size
	}{
		{"OtherHash", func(m *checkpoint.Manifest) { m.SHA256 = strings.Repeat("0", 64) }, true},
		{"LongerTar", func(m *checkpoint.Manifest) { m.RawSize++ }, false},
		{"ShorterTar", func(m *checkpoint.Manifest) { m.RawSize-- }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := m
			tc.edit(&edited)
			if _, err := objs.Put(t.Context(), key, strings.NewReader(mustJSON(t, edited)), checkpoint.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			defer objs.Put(context.WithoutCancel(t.Context()), key, strings.NewReader(mustJSON(t, m)), checkpoint.PutOptions{})
			if _, err := readBack(t, st, sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("reading: got %v, want ErrCorrupt", err)
			}
			if _, err := st.Verify(t.Context(), sc, m.ID); tc.verifyFail != errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Verify: got %v, want ErrCorrupt %v", err, tc.verifyFail)
			}
		})
	}
}

func TestCorruptManifest(t *testing.T) {
	st, objs := newStore(t, checkpoint.Options{})
	sc := newScope()
	tarball, _ := smallTar(t, 8)
	m := save(t, st, sc, tarball, "")
	key := strings.TrimSuffix(m.Object, ".tar.zst") + ".json"
	for name, body := range map[string]string{
		"NotJSON":     "{",
		"OtherObject": strings.Replace(mustJSON(t, m), m.Object, "elsewhere", 1),
		"OtherFormat": strings.Replace(mustJSON(t, m), checkpoint.Format, "tar+gzip/v9", 1),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := objs.Put(t.Context(), key, strings.NewReader(body), checkpoint.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Get(t.Context(), sc, m.ID); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("Get: got %v, want ErrCorrupt", err)
			}
			if _, err := st.List(t.Context(), sc); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Errorf("List: got %v, want ErrCorrupt", err)
			}
		})
	}
	// A corrupt checkpoint can still be deleted.
	if err := st.Delete(t.Context(), sc, m.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	// Its number stays taken: its tombstone is all that is left.
	if got := objectKeys(t, objs); len(got) != 1 || !strings.HasSuffix(got[0], ".deleted") {
		t.Errorf("objects after Delete = %q, want its tombstone alone", got)
	}
}

func TestEmptyStream(t *testing.T) {
	st, _ := newStore(t, checkpoint.Options{})
	sc := newScope()
	m := save(t, st, sc, nil, "")
	if m.RawSize != 0 || m.Size == 0 {
		t.Errorf("sizes = %d raw, %d stored; want 0 raw and a zstd frame", m.RawSize, m.Size)
	}
	if sum, err := readBack(t, st, sc, m.ID); err != nil || sum != sha256.Sum256(nil) {
		t.Errorf("read back: %x, %v; want the empty stream", sum, err)
	}
}
