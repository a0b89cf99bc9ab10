package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"

	"sandboxd/internal/checkpoint"
	"sandboxd/internal/checkpoint/storetest"
)

// These tests run GCSStore against fake-gcs-server, in process on loopback, with its
// in-memory backend. The emulator honours what GCSStore relies on: DoesNotExist
// (ifGenerationMatch=0) on uploads, resumable chunked uploads that publish nothing until
// they are finalized, reads of a given generation, prefix listing. It ignores preconditions
// on delete, read and metadata update, which GCSStore does not use.

// fakeGCS starts fake-gcs-server on loopback and returns it with a client for it; both
// are closed when t ends.
func fakeGCS(t *testing.T) (*fakestorage.Server, *storage.Client) {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: 0,
		PublicHost: "127.0.0.1", // without it, reads (XML API) get 404
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	client, err := storage.NewClient(t.Context(),
		option.WithEndpoint(srv.URL()+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() }) // before srv.Stop
	return srv, client
}

var bucketSeq atomic.Int64

// newBucket creates an empty bucket with a fresh name.
func newBucket(t *testing.T, srv *fakestorage.Server) string {
	t.Helper()
	name := fmt.Sprintf("test-bucket-%d", bucketSeq.Add(1))
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: name})
	return name
}

func newGCS(t *testing.T, srv *fakestorage.Server, client *storage.Client, opts checkpoint.GCSOptions) *checkpoint.GCSStore {
	t.Helper()
	opts.Bucket, opts.Client = newBucket(t, srv), client
	s, err := checkpoint.NewGCSStore(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestGCSStoreConformance(t *testing.T) {
	srv, client := fakeGCS(t)
	t.Run("Defaults", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) checkpoint.ObjectStore {
			return newGCS(t, srv, client, checkpoint.GCSOptions{})
		})
	})
	// Under a prefix, next to objects that are not the store's, and with chunks small
	// enough that the failing and cancelled Puts have sent whole chunks of a resumable
	// upload before they abandon it.
	t.Run("PrefixSmallChunks", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) checkpoint.ObjectStore {
			s := newGCS(t, srv, client, checkpoint.GCSOptions{Prefix: "/ws/ckpt/", ChunkSize: 1 << 20})
			bucket := s.Bucket()
			for _, name := range []string{"other", "ws/ckpt-other/p/a", "ws/ckpt", "ws/other/ckpt/p/a"} {
				srv.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: name},
					Content: []byte("not the store's")})
			}
			return s
		})
	})
}

// Keys are object names under the prefix; names GCS refuses are refused before a request.
func TestGCSStoreKeys(t *testing.T) {
	srv, client := fakeGCS(t)
	s := newGCS(t, srv, client, checkpoint.GCSOptions{Prefix: "pre"})
	if _, err := s.Put(t.Context(), "a/b", strings.NewReader("x"), checkpoint.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.GetObject(s.Bucket(), "pre/a/b"); err != nil {
		t.Errorf("object pre/a/b: %v", err)
	}
	for _, key := range []string{"", "a\nb", "a\rb", "\xff", strings.Repeat("k", 1021)} {
		_, err := s.Put(t.Context(), key, strings.NewReader("x"), checkpoint.PutOptions{})
		if !errors.Is(err, checkpoint.ErrInvalidKey) {
			t.Errorf("Put(%q): got %v, want ErrInvalidKey", key, err)
		}
	}
	if _, err := s.Put(t.Context(), strings.Repeat("k", 1020), strings.NewReader("x"), checkpoint.PutOptions{}); err != nil {
		t.Errorf("Put of a 1024-byte name: %v", err)
	}
	if _, err := checkpoint.NewGCSStore(t.Context(), checkpoint.GCSOptions{Client: client}); err == nil {
		t.Error("NewGCSStore without a bucket: got nil error, want one")
	}
}

// IfNotExists holds for a Put large enough to be a resumable upload of several chunks (as
// Save's data objects are), alone and racing.
func TestGCSStoreIfNotExistsResumable(t *testing.T) {
	srv, client := fakeGCS(t)
	s := newGCS(t, srv, client, checkpoint.GCSOptions{ChunkSize: 256 << 10})
	big := func(c byte) io.Reader { return bytes.NewReader(bytes.Repeat([]byte{c}, 1<<20)) }
	if _, err := s.Put(t.Context(), "k", strings.NewReader("first"), checkpoint.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// A plain io.Reader, so that the Put cannot size its buffer to the object.
	if _, err := s.Put(t.Context(), "k", io.MultiReader(big('x')), checkpoint.PutOptions{IfNotExists: true}); !errors.Is(err, checkpoint.ErrPrecondition) {
		t.Errorf("Put IfNotExists over an object: got %v, want ErrPrecondition", err)
	}
	if obj, err := srv.GetObject(s.Bucket(), "k"); err != nil || string(obj.Content) != "first" {
		t.Errorf("object = %.10q, %v; want %q", obj.Content, err, "first")
	}
	const writers = 4
	var won, lost atomic.Int64
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			_, err := s.Put(t.Context(), "race", io.MultiReader(big(byte('a'+i))), checkpoint.PutOptions{IfNotExists: true})
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, checkpoint.ErrPrecondition):
				lost.Add(1)
			default:
				t.Errorf("Put: %v", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 || lost.Load() != writers-1 {
		t.Errorf("got %d winners and %d ErrPrecondition, want 1 and %d", won.Load(), lost.Load(), writers-1)
	}
}

// With no Client, NewGCSStore makes one that honours STORAGE_EMULATOR_HOST.
func TestGCSStoreEmulatorHost(t *testing.T) {
	srv, _ := fakeGCS(t)
	bucket := newBucket(t, srv)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("STORAGE_EMULATOR_HOST", u.Host)
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent") // must not be needed
	s, err := checkpoint.NewGCSStore(t.Context(), checkpoint.GCSOptions{Bucket: bucket, Prefix: "p"})
	if err != nil {
		t.Fatalf("NewGCSStore: %v", err)
	}
	defer s.Close()
	meta := map[string]string{"k": "v"}
	if _, err := s.Put(t.Context(), "k", strings.NewReader("body"), checkpoint.PutOptions{Metadata: meta}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	// The object is in the emulator, and reads (JSON API) give it back with its metadata.
	if obj, err := srv.GetObject(bucket, "p/k"); err != nil || string(obj.Content) != "body" {
		t.Errorf("emulator object p/k = %q, %v; want %q", obj.Content, err, "body")
	}
	rc, a, err := s.Get(t.Context(), "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err != nil || string(b) != "body" || a.Metadata["k"] != "v" {
		t.Errorf("Get = %q (%v), metadata %v; want %q with %v", b, err, a.Metadata, "body", meta)
	}
	if err := s.Delete(t.Context(), "k"); err != nil {
		t.Errorf("Delete: %v", err)
	}
}

func newGCSCheckpoints(t *testing.T, opts checkpoint.Options) (*checkpoint.Store, *checkpoint.GCSStore) {
	t.Helper()
	srv, client := fakeGCS(t)
	objs := newGCS(t, srv, client, checkpoint.GCSOptions{Prefix: "sandboxd", ChunkSize: 1 << 20})
	return checkpoint.New(objs, opts), objs
}

// The checkpoint Store over GCS: Save, Open gives back the same tar, List, Latest.
func TestGCSCheckpointRoundTrip(t *testing.T) {
	st, objs := newGCSCheckpoints(t, checkpoint.Options{})
	sc := newScope()
	// About 12 MiB of tar: several upload chunks.
	path, entries, rawSize, rawSum := tarFile(t, 1, 200, 0, 2<<20)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := st.Save(t.Context(), sc, f, "")
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if m.N != 1 || m.RawSize != rawSize {
		t.Errorf("manifest n %d, raw size %d; want 1, %d", m.N, m.RawSize, rawSize)
	}
	dir := "checkpoints/acme/web/" + sc.Sandbox + "/"
	if keys := objectKeys(t, objs); strings.Join(keys, ",") != dir+"0000000001.json,"+dir+"0000000001.tar.zst" {
		t.Errorf("objects = %q, want the manifest and the data object", keys)
	}
	// The manifest's size and hash are those of the stored object.
	rc, a, err := objs.Get(t.Context(), m.Object)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n != m.Size || a.Size != m.Size || hex.EncodeToString(h.Sum(nil)) != m.SHA256 {
		t.Errorf("object has %d bytes (attrs %d), sha256 %x; manifest says %d, %s", n, a.Size, h.Sum(nil), m.Size, m.SHA256)
	}
	if a.ContentType != "application/zstd" || a.Metadata["snapshot-id"] != m.ID {
		t.Errorf("object content type %q, metadata %v; want application/zstd, snapshot-id %s", a.ContentType, a.Metadata, m.ID)
	}

	orc, om, err := st.Open(t.Context(), sc, m.ID)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if om != m {
		t.Errorf("Open manifest = %+v, want %+v", om, m)
	}
	if err := checkTar(orc, entries); err != nil {
		t.Errorf("tar read back: %v", err)
	}
	orc.Close()
	if sum, err := readBack(t, st, sc, m.ID); err != nil || sum != rawSum {
		t.Errorf("read back: sha256 %x, %v; want %x", sum, err, rawSum)
	}
	if vm, err := st.Verify(t.Context(), sc, m.ID); err != nil || vm != m {
		t.Errorf("Verify = %+v, %v; want the manifest", vm, err)
	}

	tarball, _ := smallTar(t, 2)
	m2 := save(t, st, sc, tarball, m.ID)
	if m2.N != 2 || m2.Parent != m.ID {
		t.Errorf("second checkpoint: n %d, parent %q; want 2, %q", m2.N, m2.Parent, m.ID)
	}
	list, err := st.List(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(list), []string{m.ID, m2.ID}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("List = %q, want %q", got, want)
	}
	if l, err := st.Latest(t.Context(), sc); err != nil || l != m2 {
		t.Errorf("Latest = %+v, %v; want %+v", l, err, m2)
	}
	if list, err := st.ListProject(t.Context(), "acme", "web"); err != nil || len(list) != 2 {
		t.Errorf("ListProject = %q, %v; want 2 checkpoints", ids(list), err)
	}
	for _, k := range objectKeys(t, objs) {
		if strings.HasSuffix(k, ".claim") {
			t.Errorf("claim %s left behind", k)
		}
	}
	if err := st.Delete(t.Context(), sc, m.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if got := objectKeys(t, objs); len(got) != 2 || got[1] != m2.Object {
		t.Errorf("objects after Delete = %q, want only checkpoint 2", got)
	}
}

// Concurrent Saves of one sandbox each get a number of their own (claims are written
// if-not-exists, which the emulator honours).
func TestGCSConcurrentSaves(t *testing.T) {
	st, _ := newGCSCheckpoints(t, checkpoint.Options{})
	checkConcurrentSaves(t, st, 20)
}

// A Save that fails midway leaves no object on GCS, after whole chunks were uploaded.
func TestGCSFailedSaveLeavesNothing(t *testing.T) {
	errBoom := errors.New("boom")
	var big bytes.Buffer
	if _, err := writeTar(&big, 12, 0, 6<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	tarball := big.Bytes()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error
		want error
	}{
		{"ReaderFailsMidway", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			_, err := st.Save(t.Context(), sc, tarThenFail(tarball, len(tarball)*3/4, errBoom), "")
			return err
		}, errBoom},
		{"CancelledMidway", func(t *testing.T, st *checkpoint.Store, sc checkpoint.Scope) error {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r := io.MultiReader(bytes.NewReader(tarball[:len(tarball)*3/4]), cancelReader{cancel}, bytes.NewReader(tarball[len(tarball)*3/4:]))
			_, err := st.Save(ctx, sc, r, "")
			return err
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, objs := newGCSCheckpoints(t, checkpoint.Options{})
			sc := newScope()
			if err := tc.run(t, st, sc); !errors.Is(err, tc.want) {
				t.Fatalf("Save: got %v, want %v", err, tc.want)
			}
			if got := objectKeys(t, objs); len(got) != 0 {
				t.Errorf("objects after a failed Save = %q, want none", got)
			}
			if m := save(t, st, sc, tarball, ""); m.N != 1 {
				t.Errorf("next Save: n %d, want 1", m.N)
			}
		})
	}
}
