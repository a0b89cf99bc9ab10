package source_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Started by an init function of go.opencensus.io, which fake-gcs-server (gcs_test.go)
		// imports through its Pub/Sub notifications; it never ends.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

var mtime = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// typSocket is a socket entry (zip only: tar has no type for one).
const typSocket = 's'

// ent is an entry of a test archive.
type ent struct {
	name string
	typ  byte // a tar type flag; 0 for a regular file
	body string
	link string
	mode int64
}

func reg(name, body string) ent         { return ent{name: name, typ: tar.TypeReg, body: body} }
func dir(name string) ent               { return ent{name: name, typ: tar.TypeDir} }
func symlink(name, target string) ent   { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) ent  { return ent{name: name, typ: tar.TypeLink, link: target} }
func special(name string, typ byte) ent { return ent{name: name, typ: typ} }
func withMode(e ent, mode int64) ent    { e.mode = mode; return e }
func regN(name string, n int) ent       { return reg(name, strings.Repeat("x", n)) }
func ents(e ...ent) []ent               { return e }
func names(prefix string, n int) (es []ent) {
	for i := range n {
		es = append(es, reg(prefix+string(rune('a'+i)), "x"))
	}
	return es
}

func tarBytes(t testing.TB, es []ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Linkname: e.link, Mode: e.mode, ModTime: mtime}
		if h.Mode == 0 {
			h.Mode = 0o644
			if typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipBytes(t testing.TB, b []byte) []byte {
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

func zstdBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

func zipBytes(t testing.TB, es []ent) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, e := range es {
		fh := &zip.FileHeader{Name: e.name, Method: zip.Deflate, Modified: mtime}
		body := e.body
		perm := fs.FileMode(e.mode & 0o777)
		if e.mode&0o4000 != 0 {
			perm |= fs.ModeSetuid
		}
		switch e.typ {
		case tar.TypeDir:
			fh.SetMode(fs.ModeDir | 0o755)
		case tar.TypeSymlink:
			fh.SetMode(fs.ModeSymlink | 0o777)
			body = e.link
		case tar.TypeChar:
			fh.SetMode(fs.ModeDevice | fs.ModeCharDevice | 0o644)
		case tar.TypeBlock:
			fh.SetMode(fs.ModeDevice | 0o644)
		case tar.TypeFifo:
			fh.SetMode(fs.ModeNamedPipe | 0o644)
		case typSocket:
			fh.SetMode(fs.ModeSocket | 0o644)
		case tar.TypeLink:
			t.Fatalf("zip has no hard links (%q)", e.name)
		default:
			if perm == 0 {
				perm = 0o644
			}
			fh.SetMode(perm)
		}
		w, err := zw.CreateHeader(fh)
		if err != nil {
			t.Fatalf("zip header %q: %v", e.name, err)
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

// formats builds an archive of es in each format.
var formats = []struct {
	name  string
	zip   bool
	build func(testing.TB, []ent) []byte
}{
	{"tar", false, tarBytes},
	{"tar.gz", false, func(t testing.TB, es []ent) []byte { return gzipBytes(t, tarBytes(t, es)) }},
	{"tar.zst", false, func(t testing.TB, es []ent) []byte { return zstdBytes(t, tarBytes(t, es)) }},
	{"zip", true, zipBytes},
}

// server is an HTTPS server on loopback that serves what its tests put on it.
type server struct {
	*httptest.Server
	mux *http.ServeMux
}

func newServer(t *testing.T) *server {
	t.Helper()
	s := &server{mux: http.NewServeMux()}
	s.Server = httptest.NewUnstartedServer(s.mux)
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// put serves b at p; the URL's extension says nothing (a test may lie with it).
func (s *server) put(p string, b []byte) string {
	s.mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", mtime, bytes.NewReader(b))
	})
	return s.URL + p
}

func (s *server) host() string { return s.Listener.Addr().String() }

func (s *server) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

// fetcher trusts s and allow-lists its host:port.
func (s *server) fetcher(t *testing.T, opts source.Options) *source.Fetcher {
	t.Helper()
	if opts.RootCAs == nil {
		opts.RootCAs = s.pool()
	}
	if opts.AllowHosts == nil {
		opts.AllowHosts = []string{s.host()}
	}
	f, err := source.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// out is an entry of a fetched stream.
type out struct {
	name string
	typ  byte
	mode int64
	body string
	link string
}

// readTar reads a stream to its end (or its error).
func readTar(r io.Reader) ([]out, error) {
	tr := tar.NewReader(r)
	var got []out
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return got, err
		}
		got = append(got, out{name: h.Name, typ: h.Typeflag, mode: h.Mode, body: string(b), link: h.Linkname})
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// fetch runs Archive and reads the stream; the error is Archive's or the stream's.
func fetch(t *testing.T, f *source.Fetcher, url string) ([]out, error) {
	t.Helper()
	rc, err := f.Archive(ctxT(t, 2*time.Minute), url)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return readTar(rc)
}

// wantErr checks that err carries code and that its public message holds every one of want.
func wantErr(t *testing.T, err error, code apierror.Code, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	var e *apierror.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want an *apierror.Error with %s", err, err, code)
	}
	if e.Code != code {
		t.Errorf("got code %s (%q), want %s", e.Code, e.Message, code)
	}
	for _, w := range want {
		if !strings.Contains(e.Message, w) {
			t.Errorf("got message %q, want it to hold %q", e.Message, w)
		}
	}
}
