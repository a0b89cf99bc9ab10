package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"sync"
	"testing"

	"sandboxd/internal/checkpoint"
)

func newStore(t *testing.T, opts checkpoint.Options) (*checkpoint.Store, *checkpoint.LocalStore) {
	t.Helper()
	objs := newLocal(t)
	return checkpoint.New(objs, opts), objs
}

// smallTar returns a small generated tar and its entries.
func smallTar(t *testing.T, seed uint64) ([]byte, []genFile) {
	t.Helper()
	var buf bytes.Buffer
	entries, err := writeTar(&buf, seed, 20, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), entries
}

func save(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope, tarball []byte, parent string) checkpoint.Manifest {
	t.Helper()
	m, err := st.Save(t.Context(), sc, bytes.NewReader(tarball), parent)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	return m
}

// readBack opens a checkpoint and reads it to the end; it returns the bytes' sha256 and the
// first error of Open or of the stream.
func readBack(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope, id string) ([32]byte, error) {
	t.Helper()
	rc, _, err := st.Open(t.Context(), sc, id)
	if err != nil {
		return [32]byte{}, err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return [32]byte{}, err
	}
	return [32]byte(h.Sum(nil)), nil
}

// objectKeys lists every object of the store.
func objectKeys(t *testing.T, objs checkpoint.ObjectStore) []string {
	t.Helper()
	list, err := objs.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, o := range list {
		out = append(out, o.Key)
	}
	return out
}

func ids(ms []checkpoint.Manifest) []string {
	out := []string{}
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// checkConcurrentSaves runs four Saves of one sandbox at once: each gets a number of its own
// and its own bytes back. seed varies the tars.
func checkConcurrentSaves(t *testing.T, st *checkpoint.Store, seed uint64) {
	t.Helper()
	sc := newScope()
	const writers = 4
	tarballs := make([][]byte, writers)
	for i := range tarballs {
		tarballs[i], _ = smallTar(t, seed+uint64(i))
	}
	results := make([]checkpoint.Manifest, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = st.Save(t.Context(), sc, bytes.NewReader(tarballs[i]), "")
		})
	}
	close(start)
	wg.Wait()
	seen := map[int64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Save %d: %v", i, err)
		}
		if seen[results[i].N] {
			t.Errorf("two Saves got n %d", results[i].N)
		}
		seen[results[i].N] = true
		if sum, err := readBack(t, st, sc, results[i].ID); err != nil || sum != sha256.Sum256(tarballs[i]) {
			t.Errorf("checkpoint %s: %v, or not the tar of Save %d", results[i].ID, err, i)
		}
	}
	if list, err := st.List(t.Context(), sc); err != nil || len(list) != writers {
		t.Errorf("List = %q, %v; want %d checkpoints", ids(list), err, writers)
	}
}

// tarThenFail yields the first n bytes of a tar stream, then err.
func tarThenFail(tarball []byte, n int, err error) io.Reader {
	return io.MultiReader(bytes.NewReader(tarball[:n]), errReader{err})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// cancelReader cancels when first read, and then reads nothing.
type cancelReader struct{ cancel context.CancelFunc }

func (r cancelReader) Read([]byte) (int, error) {
	r.cancel()
	return 0, io.EOF
}

func jsonDecode(rc io.ReadCloser, v any) error {
	defer rc.Close()
	return json.NewDecoder(rc).Decode(v)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
