// Package sourcetest builds archives, serves them over HTTPS on loopback and starts
// fake-gcs-server, for tests of bootstrap sources (internal/source, internal/sandbox, the
// end-to-end tests).
// It is test support only: nothing else imports it.
package sourcetest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"encoding/pem"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/klauspost/compress/zstd"
	"google.golang.org/api/option"
)

// Mtime is every entry's modification time.
var Mtime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// Entry is one entry of a test archive.
type Entry struct {
	Name string
	// Type is a tar type flag (tar.TypeReg, TypeDir, TypeSymlink, TypeChar, …); 0 is a file.
	Type byte
	Body string
	// Link is a symlink's target.
	Link string
	// Mode is the permission bits (0: 0644 for a file, 0755 for a directory).
	Mode int64
}

// File, Dir, Symlink and CharDevice are entries.
func File(name, body string) Entry { return Entry{Name: name, Type: tar.TypeReg, Body: body} }
func Dir(name string) Entry        { return Entry{Name: name, Type: tar.TypeDir} }
func Symlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Link: target}
}
func CharDevice(name string) Entry { return Entry{Name: name, Type: tar.TypeChar} }

// Tar is a tar archive of es.
func Tar(t testing.TB, es []Entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Link, Mode: e.Mode, ModTime: Mtime,
			Size: int64(len(e.Body)), Format: tar.FormatPAX}
		switch e.Type {
		case 0, tar.TypeReg:
			h.Typeflag = tar.TypeReg
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		case tar.TypeDir:
			h.Size = 0
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		default:
			h.Size = 0
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", e.Name, err)
		}
		if h.Size > 0 {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TarGz is a gzip-compressed tar archive of es.
func TarGz(t testing.TB, es []Entry) []byte {
	t.Helper()
	return Gzip(t, Tar(t, es))
}

// Gzip compresses b.
func Gzip(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TarZst is a zstd-compressed tar archive of es.
func TarZst(t testing.TB, es []Entry) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(Tar(t, es), nil)
}

// Zip is a zip archive of es (a symlink's target is its content, as zip tools store it).
func Zip(t testing.TB, es []Entry) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, e := range es {
		fh := &zip.FileHeader{Name: e.Name, Method: zip.Deflate, Modified: Mtime}
		body := e.Body
		switch e.Type {
		case tar.TypeDir:
			fh.SetMode(fs.ModeDir | 0o755)
		case tar.TypeSymlink:
			fh.SetMode(fs.ModeSymlink | 0o777)
			body = e.Link
		case tar.TypeChar:
			fh.SetMode(fs.ModeDevice | fs.ModeCharDevice | 0o644)
		case 0, tar.TypeReg:
			mode := fs.FileMode(e.Mode & 0o777)
			if mode == 0 {
				mode = 0o644
			}
			fh.SetMode(mode)
		default:
			t.Fatalf("sourcetest: zip cannot hold %q of type %q", e.Name, e.Type)
		}
		w, err := zw.CreateHeader(fh)
		if err != nil {
			t.Fatalf("zip header %q: %v", e.Name, err)
		}
		if _, err := io.WriteString(w, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Formats are the archive formats a source may be, each with its builder.
var Formats = []struct {
	Name  string
	Build func(testing.TB, []Entry) []byte
}{
	{"zip", Zip},
	{"tar", Tar},
	{"tar.gz", TarGz},
	{"tar.zst", TarZst},
}

// Server is an HTTPS server on 127.0.0.1 with a certificate of its own (trust it with Pool
// or the PEM file WriteCA writes). It counts the requests of every path.
type Server struct {
	*httptest.Server
	mux *http.ServeMux

	mu   sync.Mutex
	hits map[string]*atomic.Int64
}

// NewServer starts a Server; it is closed when t ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := &Server{mux: http.NewServeMux(), hits: map[string]*atomic.Int64{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.counter(r.URL.Path).Add(1)
		s.mux.ServeHTTP(w, r)
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *Server) counter(path string) *atomic.Int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.hits[path]
	if !ok {
		c = new(atomic.Int64)
		s.hits[path] = c
	}
	return c
}

// Put serves b at path and returns its URL.
func (s *Server) Put(path string, b []byte) string {
	return s.Handle(path, func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", Mtime, bytes.NewReader(b))
	})
}

// Handle serves path with h and returns its URL.
func (s *Server) Handle(path string, h http.HandlerFunc) string {
	s.mux.HandleFunc("GET "+path, h)
	return s.URL + path
}

// Hits is how many requests path got.
func (s *Server) Hits(path string) int64 { return s.counter(path).Load() }

// Host is the server's "127.0.0.1:port", as an allow list names it.
func (s *Server) Host() string { return s.Listener.Addr().String() }

// Pool is a certificate pool that trusts the server.
func (s *Server) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

// WriteCA writes the server's certificate as PEM into dir and returns the file's path.
func (s *Server) WriteCA(t testing.TB, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "archive-host-ca-*.pem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// FakeGCS starts fake-gcs-server in process on loopback with objs (name → content) in
// bucket, and returns it with a client for it; both are closed when t ends.
func FakeGCS(t testing.TB, bucket string, objs map[string]string) (*fakestorage.Server, *storage.Client) {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: 0,
		PublicHost: "127.0.0.1", // without it, reads get 404
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: bucket})
	for name, body := range objs {
		srv.CreateObject(fakestorage.Object{
			ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: name},
			Content:     []byte(body),
		})
	}
	client, err := storage.NewClient(t.Context(),
		option.WithEndpoint(srv.URL()+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() }) // before srv.Stop
	return srv, client
}
