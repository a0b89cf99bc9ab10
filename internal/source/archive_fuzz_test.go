package source

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source/sourcetest"
	"sandboxd/internal/tarsafe"
	"sandboxd/internal/tarsafe/tarsafetest"
)

// Limits of FuzzArchive's fetcher: small, so that every input is cheap.
const (
	szMaxFiles = 64
	szMaxTotal = 256 << 10
)

// FuzzArchive serves fuzz bytes as an archive (zip, tar, tar.gz or tar.zst: Archive tells them
// by their bytes) and reads the normalized stream Archive makes of it. Neither may panic. Every
// refusal, up front or midway through the stream, is INVALID_ARGUMENT or PAYLOAD_TOO_LARGE.
// Every entry the stream carries before it ends or fails (a consumer applies them in order) is
// a regular file, directory, symlink or hard link with a clean relative name, whose parent
// folder came before it as a directory (nothing lies below a file or a symlink, no directory
// is replaced), within the file and size limits, with sane modes; a hard link names an earlier
// regular file; and every symlink, resolved like the kernel would in the extracted tree (links
// followed, ".." from where a link sits), stays inside the root.
func FuzzArchive(f *testing.F) {
	type e = tarsafetest.Ent
	trees := [][]tarsafetest.Ent{
		{{Name: "proj/", Typ: tar.TypeDir}, {Name: "proj/README.md", Body: "hello", Mode: 0o664},
			{Name: "proj/bin/run.sh", Body: "#!/bin/sh\n", Mode: 0o4755}, {Name: "proj/src/a/b/c.go", Body: "package c\n"},
			{Name: "proj/link", Typ: tar.TypeSymlink, Link: "src/a/b/c.go"}, {Name: "proj/src/up", Typ: tar.TypeSymlink, Link: "../README.md"}},
		{{Name: "../evil", Body: "x"}},
		{{Name: "/etc/passwd", Body: "x"}},
		{{Name: "a/l", Typ: tar.TypeSymlink, Link: "../../x"}},
		{{Name: "l", Typ: tar.TypeSymlink, Link: "/etc"}},
		{{Name: "a/l1", Typ: tar.TypeSymlink, Link: ".."}, {Name: "a/l2", Typ: tar.TypeSymlink, Link: "l1/../x"}},
		{{Name: "l", Typ: tar.TypeSymlink, Link: "d"}, {Name: "d/", Typ: tar.TypeDir}, {Name: "l/x", Body: "below a link"}},
		{{Name: "x", Typ: tar.TypeSymlink, Link: "y/../.."}, {Name: "y", Typ: tar.TypeSymlink, Link: "a/b"}},
		{{Name: "f", Body: "1"}, {Name: "f/x", Body: "below a file"}},
		{{Name: "d/", Typ: tar.TypeDir}, {Name: "d", Body: "replaces a dir"}},
		{{Name: "dev", Typ: tar.TypeChar}, {Name: "fifo", Typ: tar.TypeFifo}},
		{{Name: "big", Body: strings.Repeat("z", 300<<10)}},
	}
	hardlinks := [][]tarsafetest.Ent{
		{{Name: "./a/f", Body: "data"}, {Name: "a/g", Typ: tar.TypeLink, Link: "./a/f"}, {Name: "a/f", Body: "new"}},
		{{Name: "h", Typ: tar.TypeLink, Link: "../outside"}},
		{{Name: "h", Typ: tar.TypeLink, Link: "h"}},
	}
	for _, tree := range trees {
		t := tarsafetest.Tar(f, tree)
		f.Add(t)
		f.Add(sourcetest.Gzip(f, t))
		f.Add(szZstd(f, t))
		f.Add(szZip(f, tree))
	}
	for _, tree := range hardlinks {
		f.Add(tarsafetest.Tar(f, tree))
	}
	f.Add([]byte{})
	f.Add([]byte("BZh91AY&SY"))
	f.Add(make([]byte, 1024))
	f.Add(sourcetest.Gzip(f, make([]byte, 4<<20))) // a bomb of zero blocks

	var served []byte
	fetcher, err := New(Options{AllowHosts: []string{"127.0.0.1"}, MaxDownloadBytes: 1 << 20, MaxFiles: szMaxFiles,
		MaxTotalBytes: szMaxTotal, MaxRatio: 20, TempDir: tarsafetest.TempDir(f), StallTimeout: 10 * time.Second, Timeout: 20 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	// Serve from memory: no sockets (a fetch disables keep-alives, so thousands of fetches a
	// second would run out of ports), everything after the response as in production.
	fetcher.client = &http.Client{Transport: szTransport(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Body: io.NopCloser(bytes.NewReader(served)),
			ContentLength: int64(len(served)), Header: http.Header{}, Request: req}, nil
	})}

	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			return
		}
		served = data
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rc, err := fetcher.Archive(ctx, "http://127.0.0.1/archive")
		if err != nil {
			szCheckRefusal(t, err)
			return
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		s := szStream{nodes: map[string]szNode{}}
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				szCheckRefusal(t, err)
				break
			}
			s.check(t, h)
			if n, err := io.Copy(io.Discard, tr); err != nil {
				szCheckRefusal(t, err)
				break
			} else if n != h.Size {
				t.Fatalf("%q: %d bytes of %d", h.Name, n, h.Size)
			}
		}
		s.checkLinks(t)
	})
}

type szTransport func(*http.Request) (*http.Response, error)

func (t szTransport) RoundTrip(r *http.Request) (*http.Response, error) { return t(r) }

// szCheckRefusal: a refusal is a coded client error.
func szCheckRefusal(t *testing.T, err error) {
	t.Helper()
	var e *apierror.Error
	if !errors.As(err, &e) {
		t.Fatalf("got the uncoded error %v (%T), want INVALID_ARGUMENT or PAYLOAD_TOO_LARGE", err, err)
	}
	if e.Code != apierror.InvalidArgument && e.Code != apierror.PayloadTooLarge {
		t.Fatalf("got %s (%s), want INVALID_ARGUMENT or PAYLOAD_TOO_LARGE", e.Code, e.Message)
	}
}

type szNode struct {
	kind   byte
	target string
}

// szStream is what a consumer has applied of the stream so far.
type szStream struct {
	nodes   map[string]szNode
	entries int
	total   int64
}

func (s *szStream) check(t *testing.T, h *tar.Header) {
	t.Helper()
	s.entries++
	if s.entries > szMaxFiles {
		t.Fatalf("%q: entry %d, over the limit of %d", h.Name, s.entries, szMaxFiles)
	}
	name := h.Name
	if h.Typeflag == tar.TypeDir {
		if !strings.HasSuffix(name, "/") {
			t.Fatalf("directory %q: no trailing slash", name)
		}
		name = strings.TrimSuffix(name, "/")
	}
	if name == "" || name == "." || !filepath.IsLocal(name) || path.Clean(name) != name || strings.Contains(name, "\x00") ||
		len(name) > tarsafe.MaxPathBytes {
		t.Fatalf("entry %q: not a clean relative name", h.Name)
	}
	tarsafetest.CheckCleanName(t, h.Name, name)
	if dir := path.Dir(name); dir != "." && s.nodes[dir].kind != tar.TypeDir {
		t.Fatalf("entry %q: its folder %q is %q, not a directory that came before", h.Name, dir, string(s.nodes[dir].kind))
	}
	prev, seen := s.nodes[name]
	if seen && prev.kind == tar.TypeDir && h.Typeflag != tar.TypeDir {
		t.Fatalf("entry %q (%q) replaces a directory", h.Name, string(h.Typeflag))
	}
	if seen && h.Typeflag == tar.TypeDir && prev.kind != tar.TypeDir {
		t.Fatalf("directory %q replaces a %q", h.Name, string(prev.kind))
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if h.Mode&^0o755 != 0 || h.Mode&0o700 != 0o700 {
			t.Fatalf("directory %q: mode %o", h.Name, h.Mode)
		}
		s.nodes[name] = szNode{kind: tar.TypeDir}
	case tar.TypeReg:
		if h.Mode&^0o755 != 0 || h.Mode&0o600 != 0o600 {
			t.Fatalf("file %q: mode %o", h.Name, h.Mode)
		}
		if s.total += h.Size; h.Size < 0 || s.total > szMaxTotal {
			t.Fatalf("file %q: %d bytes takes the content to %d, over %d", h.Name, h.Size, s.total, szMaxTotal)
		}
		s.nodes[name] = szNode{kind: tar.TypeReg}
	case tar.TypeLink:
		if l := s.nodes[h.Linkname]; l.kind != tar.TypeReg || h.Linkname == name || h.Size != 0 {
			t.Fatalf("hard link %q -> %q: not an earlier regular file", h.Name, h.Linkname)
		}
		s.nodes[name] = szNode{kind: tar.TypeReg}
	case tar.TypeSymlink:
		if h.Linkname == "" || path.IsAbs(h.Linkname) || strings.Contains(h.Linkname, "\x00") || len(h.Linkname) > tarsafe.MaxPathBytes {
			t.Fatalf("symlink %q -> %q: not a relative target", h.Name, h.Linkname)
		}
		s.nodes[name] = szNode{kind: tar.TypeSymlink, target: h.Linkname}
	default:
		t.Fatalf("entry %q has the type %q", h.Name, string(h.Typeflag))
	}
}

// checkLinks resolves every symlink of the tree as the kernel would once it is extracted
// into an empty root: a link's target is taken from the link's folder, symlinks met on the
// way are followed (40 at most, then the kernel gives ELOOP and resolves nothing), ".." climbs
// from where the walk is. A missing component is walked on lexically (stricter than the
// kernel's ENOENT: a later import could create it). No walk may climb out of the root.
func (s *szStream) checkLinks(t *testing.T) {
	t.Helper()
	for name, n := range s.nodes {
		if n.kind != tar.TypeSymlink {
			continue
		}
		var stack []string
		if dir := path.Dir(name); dir != "." {
			stack = strings.Split(dir, "/")
		}
		pending := strings.Split(n.target, "/")
		hops := 0
		for len(pending) > 0 && hops <= 40 {
			c := pending[0]
			pending = pending[1:]
			switch c {
			case "", ".":
				continue
			case "..":
				if len(stack) == 0 {
					t.Fatalf("symlink %q -> %q resolves out of the root (tree %v)", name, n.target, s.nodes)
				}
				stack = stack[:len(stack)-1]
				continue
			}
			stack = append(stack, c)
			if l := s.nodes[strings.Join(stack, "/")]; l.kind == tar.TypeSymlink {
				hops++
				stack = stack[:len(stack)-1]
				if path.IsAbs(l.target) {
					t.Fatalf("symlink %q -> %q goes through an absolute symlink", name, n.target)
				}
				pending = append(strings.Split(l.target, "/"), pending...)
			}
		}
	}
}

func szZip(tb testing.TB, ents []tarsafetest.Ent) []byte {
	tb.Helper()
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	for _, e := range ents {
		fh := &zip.FileHeader{Name: e.Name, Method: zip.Deflate, Modified: time.Unix(1700000000, 0)}
		body := e.Body
		switch e.Typ {
		case tar.TypeDir:
			fh.SetMode(fs.ModeDir | 0o755)
		case tar.TypeSymlink:
			fh.SetMode(fs.ModeSymlink | 0o777)
			body = e.Link
		case tar.TypeChar:
			fh.SetMode(fs.ModeDevice | fs.ModeCharDevice | 0o644)
		case tar.TypeFifo:
			fh.SetMode(fs.ModeNamedPipe | 0o644)
		case tar.TypeLink:
			continue // zip has none
		default:
			fh.SetMode(fs.FileMode(e.Mode&0o777) | 0o600)
		}
		w, err := zw.CreateHeader(fh)
		if err != nil {
			tb.Fatalf("zip header %q: %v", e.Name, err)
		}
		if _, err := io.WriteString(w, body); err != nil {
			tb.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

func szZstd(tb testing.TB, b []byte) []byte {
	tb.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		tb.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}
