package source_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/flate"
	"crypto/rand"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source"
)

// The tree every format carries in TestArchiveFormats: nested folders without their own
// entries, a setuid file, symlinks that stay inside.
var happy = ents(
	dir("proj/"),
	withMode(reg("proj/README.md", "hello"), 0o664),
	withMode(reg("proj/bin/run.sh", "#!/bin/sh\necho hi\n"), 0o4755),
	reg("proj/src/a/b/c.go", "package c\n"),
	symlink("proj/link", "src/a/b/c.go"),
	symlink("proj/src/up", "../README.md"),
	symlink("proj/self", "../proj/bin"),
)

var happyOut = []out{
	{name: "proj/", typ: tar.TypeDir, mode: 0o755},
	{name: "proj/README.md", typ: tar.TypeReg, mode: 0o644, body: "hello"},
	{name: "proj/bin/", typ: tar.TypeDir, mode: 0o755},
	{name: "proj/bin/run.sh", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
	{name: "proj/src/", typ: tar.TypeDir, mode: 0o755},
	{name: "proj/src/a/", typ: tar.TypeDir, mode: 0o755},
	{name: "proj/src/a/b/", typ: tar.TypeDir, mode: 0o755},
	{name: "proj/src/a/b/c.go", typ: tar.TypeReg, mode: 0o644, body: "package c\n"},
	{name: "proj/link", typ: tar.TypeSymlink, mode: 0o777, link: "src/a/b/c.go"},
	{name: "proj/src/up", typ: tar.TypeSymlink, mode: 0o777, link: "../README.md"},
	{name: "proj/self", typ: tar.TypeSymlink, mode: 0o777, link: "../proj/bin"},
}

// Every format gives the same normalized stream, told apart by its bytes: each archive is
// served under the extension of another format.
func TestArchiveFormats(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	lies := map[string]string{"tar": "/a.zip", "tar.gz": "/a.tar.zst", "tar.zst": "/a.tgz", "zip": "/a.tar"}
	for _, fm := range formats {
		t.Run(fm.name, func(t *testing.T) {
			url := s.put("/"+fm.name+lies[fm.name], fm.build(t, happy))
			got, err := fetch(t, f, url)
			if err != nil {
				t.Fatalf("fetch: %v", err)
			}
			if !slices.Equal(got, happyOut) {
				t.Errorf("got\n%v\nwant\n%v", got, happyOut)
			}
		})
	}
}

// Hard links (tar only) to earlier regular files stay hard links, with clean names.
func TestArchiveHardLink(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	url := s.put("/h.tar", tarBytes(t, ents(reg("./a/f", "data"), hardlink("a/g", "./a/f"), reg("a/f", "new"))))
	got, err := fetch(t, f, url)
	if err != nil {
		t.Fatal(err)
	}
	want := []out{
		{name: "a/", typ: tar.TypeDir, mode: 0o755},
		{name: "a/f", typ: tar.TypeReg, mode: 0o644, body: "data"},
		{name: "a/g", typ: tar.TypeLink, link: "a/f"},
		{name: "a/f", typ: tar.TypeReg, mode: 0o644, body: "new"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// An empty archive is an empty stream.
func TestArchiveEmpty(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	for _, fm := range formats {
		t.Run(fm.name, func(t *testing.T) {
			got, err := fetch(t, f, s.put("/empty/"+fm.name, fm.build(t, nil)))
			if err != nil || len(got) != 0 {
				t.Errorf("got %v, %v; want no entries and no error", got, err)
			}
		})
	}
}

// Every hostile archive is refused with its code and a message that names the entry.
func TestArchiveHostile(t *testing.T) {
	type tc struct {
		name    string
		es      []ent
		tarOnly bool
		zipOnly bool
		opts    source.Options
		code    apierror.Code
		want    []string
		zipWant []string // instead of want, for zip
	}
	inv, big := apierror.InvalidArgument, apierror.PayloadTooLarge
	long := strings.Repeat("n", 256)
	cases := []tc{
		{name: "AbsolutePath", es: ents(reg("/etc/passwd", "x")), code: inv, want: []string{`"/etc/passwd"`, "absolute"}},
		{name: "ZipSlip", es: ents(reg("ok", "x"), reg("../evil.sh", "x")), code: inv, want: []string{`"../evil.sh"`, "escapes the root"}},
		{name: "ZipSlipNested", es: ents(reg("a/b/../../../evil", "x")), code: inv, want: []string{`"a/b/../../../evil"`, "escapes"}},
		{name: "SymlinkAbsolute", es: ents(symlink("etc", "/etc")), code: inv, want: []string{`"etc"`, "absolute"}},
		{name: "SymlinkEscapes", es: ents(symlink("a/link", "../../etc")), code: inv, want: []string{`"a/link"`, "outside the root"}},
		{name: "SymlinkThroughSymlink", es: ents(symlink("a/b/up", "../.."), symlink("esc", "a/b/up/../x")),
			code: inv, want: []string{`"esc"`, `goes through the symlink "a/b/up"`}},
		{name: "SymlinkLaterInPath", es: ents(symlink("esc", "a/b/up/../../x"), symlink("a/b/up", "../..")),
			code: inv, want: []string{`"a/b/up"`, `target of the symlink "esc"`}},
		{name: "SymlinkEmpty", es: ents(symlink("l", "")), tarOnly: true, code: inv, want: []string{`"l"`, "without a target"}},
		{name: "BelowSymlink", es: ents(dir("d/"), symlink("s", "d"), reg("s/f", "x")), code: inv, want: []string{`"s/f"`, `below the symlink "s"`}},
		{name: "HardLinkOutside", es: ents(hardlink("h", "../etc/passwd")), tarOnly: true, code: inv, want: []string{`"h"`, "outside the root"}},
		{name: "HardLinkAbsolute", es: ents(hardlink("h", "/etc/passwd")), tarOnly: true, code: inv, want: []string{`"h"`, "outside the root"}},
		{name: "HardLinkLater", es: ents(hardlink("h", "later"), reg("later", "x")), tarOnly: true, code: inv, want: []string{`"h"`, "not an earlier regular file"}},
		{name: "HardLinkMissing", es: ents(reg("a", "x"), hardlink("h", "nope")), tarOnly: true, code: inv, want: []string{`"h"`, "not an earlier"}},
		{name: "HardLinkToDir", es: ents(dir("d/"), hardlink("h", "d")), tarOnly: true, code: inv, want: []string{`"h"`, "not an earlier"}},
		{name: "HardLinkToSymlink", es: ents(reg("f", "x"), symlink("s", "f"), hardlink("h", "s")), tarOnly: true, code: inv, want: []string{`"h"`, "not an earlier"}},
		{name: "CharDevice", es: ents(special("dev/null", tar.TypeChar)), code: inv, want: []string{`"dev/null"`, "character device"}},
		{name: "BlockDevice", es: ents(special("dev/sda", tar.TypeBlock)), code: inv, want: []string{`"dev/sda"`, "block device"}},
		{name: "FIFO", es: ents(special("pipe", tar.TypeFifo)), code: inv, want: []string{`"pipe"`, "FIFO"}},
		{name: "Socket", es: ents(special("sock", typSocket)), zipOnly: true, code: inv, want: []string{`"sock"`, "socket"}},
		{name: "NULInName", es: ents(reg("a\x00b", "x")), zipOnly: true, code: inv, want: []string{`"a\x00b"`, "NUL"}},
		{name: "LongComponent", es: ents(reg("a/"+long, "x")), code: inv, want: []string{long, "255 bytes"}},
		{name: "RootAsFile", es: ents(reg(".", "x")), tarOnly: true, code: inv, want: []string{`"."`, "root"}},
		{name: "DirThenFile", es: ents(dir("d/"), reg("d", "x")), code: inv, want: []string{`"d"`, "replaces a directory"}},
		{name: "ImpliedDirThenFile", es: ents(reg("d/x", "x"), reg("d", "x")), code: inv, want: []string{`"d"`, "replaces a directory"}},
		{name: "FileThenDir", es: ents(reg("f", "x"), dir("f/")), code: inv, want: []string{`"f/"`, "with a directory"}},
		{name: "BelowFile", es: ents(reg("f", "x"), reg("f/x", "x")), code: inv, want: []string{`"f/x"`, `below the file "f"`}},
		{name: "TooManyFiles", es: names("f", 5), opts: source.Options{MaxFiles: 3}, code: big,
			want: []string{`"fd"`, "limit of 3"}, zipWant: []string{"5 entries", "limit of 3"}},
		{name: "TotalOver", es: ents(regN("a", 60), regN("b", 60)), opts: source.Options{MaxTotalBytes: 100}, code: big,
			want: []string{`"b"`, "limit of 100 bytes"}},
		{name: "FileOver", es: ents(regN("small", 10), regN("big", 11)), opts: source.Options{MaxFileBytes: 10}, code: big,
			want: []string{`"big"`, "11 bytes", "limit of 10 bytes per file"}},
	}
	s := newServer(t)
	for _, c := range cases {
		for _, fm := range formats {
			if c.tarOnly && fm.zip || c.zipOnly && !fm.zip {
				continue
			}
			t.Run(c.name+"/"+fm.name, func(t *testing.T) {
				f := s.fetcher(t, c.opts)
				url := s.put("/hostile/"+c.name+"/"+fm.name, fm.build(t, c.es))
				_, err := fetch(t, f, url)
				want := c.want
				if fm.zip && c.zipWant != nil {
					want = c.zipWant
				}
				wantErr(t, err, c.code, want...)
			})
		}
	}
}

// A refusal in the middle of a tar stream ends the stream with that error after the good
// entries before it.
func TestArchiveRefusedMidStream(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	url := s.put("/mid.tar.gz", gzipBytes(t, tarBytes(t, ents(reg("good", "1"), reg("../bad", "2")))))
	rc, err := f.Archive(ctxT(t, time.Minute), url)
	if err != nil {
		t.Fatalf("Archive: %v (want the refusal from the stream)", err)
	}
	defer rc.Close()
	got, err := readTar(rc)
	wantErr(t, err, apierror.InvalidArgument, `"../bad"`)
	if len(got) != 1 || got[0].name != "good" {
		t.Errorf("got entries %v before the error, want just good", got)
	}
}

// Malformed archives and formats that are not supported are INVALID_ARGUMENT.
func TestArchiveMalformed(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	tarball := tarBytes(t, ents(reg("first", "1"), regN("big", 4096)))
	storedZip := func(body string) []byte {
		var b bytes.Buffer
		zw := zip.NewWriter(&b)
		w, err := zw.CreateHeader(&zip.FileHeader{Name: "data.txt", Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, body)
		zw.Close()
		return b.Bytes()
	}
	corrupt := storedZip("precious data")
	i := bytes.Index(corrupt, []byte("precious"))
	corrupt[i] = 'P'
	rawZip := func(fh *zip.FileHeader, raw []byte) []byte {
		var b bytes.Buffer
		zw := zip.NewWriter(&b)
		w, err := zw.CreateRaw(fh)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(raw)
		zw.Close()
		return b.Bytes()
	}
	cases := []struct {
		name string
		body []byte
		want []string
	}{
		{"Text", []byte("<html>not an archive</html>"), []string{"not a zip, tar, tar.gz or tar.zst archive"}},
		{"Empty", nil, []string{"empty"}},
		{"Xz", []byte("\xfd7zXZ\x00\x00\x04"), []string{"xz", "not supported"}},
		{"GzipNotTar", gzipBytes(t, []byte(strings.Repeat("plain text\n", 100))), []string{"gzip stream", "does not hold a tar archive"}},
		{"ZstdNotTar", zstdBytes(t, []byte(strings.Repeat("plain text\n", 100))), []string{"zstd stream", "does not hold a tar archive"}},
		{"TruncatedTar", tarball[:512*2+1000], []string{`"big"`, "malformed"}},
		{"TruncatedTarGz", half(gzipBytes(t, tarball)), []string{"malformed"}},
		{"ZipBadCRC", corrupt, []string{`"data.txt"`, "malformed", "checksum"}},
		{"ZipEncrypted", rawZip(&zip.FileHeader{Name: "secret", Method: zip.Store, Flags: 1, CompressedSize64: 3, UncompressedSize64: 3}, []byte("abc")),
			[]string{`"secret"`, "encrypted"}},
		{"ZipLZMA", rawZip(&zip.FileHeader{Name: "l", Method: 14, CompressedSize64: 3, UncompressedSize64: 3}, []byte("abc")),
			[]string{`"l"`, "compression method 14"}},
		{"ZipTruncated", zipBytes(t, happy)[:100], []string{"zip archive is malformed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := fetch(t, f, s.put("/bad/"+c.name, c.body))
			wantErr(t, err, apierror.InvalidArgument, c.want...)
		})
	}
}

// MaxDownloadBytes bounds the bytes downloaded, with or without a Content-Length.
func TestArchiveDownloadLimit(t *testing.T) {
	s := newServer(t)
	body := tarBytes(t, ents(regN("f", 8000)))
	noise := make([]byte, 8000)
	rand.Read(noise)
	zipBody := zipBytes(t, ents(reg("a", string(noise))))
	s.put("/known.tar", body)
	chunked := func(b []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for len(b) > 0 {
				n := min(len(b), 512)
				w.Write(b[:n])
				w.(http.Flusher).Flush()
				b = b[n:]
			}
		}
	}
	s.mux.HandleFunc("GET /chunked.tar", chunked(body))
	s.mux.HandleFunc("GET /chunked.zip", chunked(zipBody))
	f := s.fetcher(t, source.Options{MaxDownloadBytes: 4096})
	for _, p := range []string{"/known.tar", "/chunked.tar", "/chunked.zip"} {
		t.Run(strings.TrimPrefix(p, "/"), func(t *testing.T) {
			_, err := fetch(t, f, s.URL+p)
			wantErr(t, err, apierror.PayloadTooLarge, "limit of 4096 bytes")
		})
	}
}

// MaxRatio refuses content that expands too much for its compressed size.
func TestArchiveRatio(t *testing.T) {
	s := newServer(t)
	zeros := string(make([]byte, 4<<20))
	es := ents(reg("small", "x"), reg("zeros", zeros))
	f := s.fetcher(t, source.Options{MaxRatio: 20})
	for _, fm := range formats[1:] { // plain tar is not compressed
		t.Run(fm.name, func(t *testing.T) {
			_, err := fetch(t, f, s.put("/ratio/"+fm.name, fm.build(t, es)))
			wantErr(t, err, apierror.PayloadTooLarge, `"zeros"`, "ratio")
		})
	}
	t.Run("UnderTheRatio", func(t *testing.T) {
		f := s.fetcher(t, source.Options{MaxRatio: 1e9})
		if _, err := fetch(t, f, s.put("/ratio/ok", gzipBytes(t, tarBytes(t, es)))); err != nil {
			t.Errorf("got %v, want no error", err)
		}
	})
}

// A consumer that closes the stream early stops the download; nothing leaks (goleak).
func TestArchiveCloseEarly(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	var es []ent
	for i := range 64 {
		es = append(es, reg(fmt.Sprintf("f%02d", i), strings.Repeat("y", 64<<10)))
	}
	for _, fm := range formats {
		t.Run(fm.name, func(t *testing.T) {
			rc, err := f.Archive(ctxT(t, time.Minute), s.put("/close/"+fm.name, fm.build(t, es)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(rc, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			if err := rc.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := rc.Read(make([]byte, 1)); err == nil {
				t.Error("Read after Close: got no error")
			}
		})
	}
}

// Zip bombs: a declared size over the limit is refused from the directory, before anything
// is inflated; a size that lies is caught after the declared bytes.
func TestArchiveZipBomb(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{MaxTotalBytes: 16 << 20})
	deflate := func(n int) []byte {
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, flate.BestCompression)
		zero := make([]byte, 1<<20)
		for n > 0 {
			k := min(n, len(zero))
			w.Write(zero[:k])
			n -= k
		}
		w.Close()
		return b.Bytes()
	}
	build := func(declared uint64, raw []byte, crc uint32) []byte {
		var b bytes.Buffer
		zw := zip.NewWriter(&b)
		w, err := zw.CreateRaw(&zip.FileHeader{Name: "bomb.bin", Method: zip.Deflate, CRC32: crc,
			CompressedSize64: uint64(len(raw)), UncompressedSize64: declared})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(raw)
		zw.Close()
		return b.Bytes()
	}
	t.Run("Declared10GiB", func(t *testing.T) {
		_, err := fetch(t, f, s.put("/zipbomb/declared", build(10<<30, deflate(1<<20), 0)))
		wantErr(t, err, apierror.PayloadTooLarge, `"bomb.bin"`, "10737418240 bytes")
	})
	t.Run("LyingSize", func(t *testing.T) {
		raw := deflate(4 << 20)
		_, err := fetch(t, f, s.put("/zipbomb/lying", build(1024, raw, crc32.ChecksumIEEE(make([]byte, 1024)))))
		wantErr(t, err, apierror.InvalidArgument, `"bomb.bin"`, "malformed")
	})
	t.Run("ManyEntries", func(t *testing.T) {
		var es []ent
		for i := range 20 {
			es = append(es, reg(fmt.Sprintf("z%02d", i), string(make([]byte, 1<<20))))
		}
		_, err := fetch(t, f, s.put("/zipbomb/many", zipBytes(t, es)))
		wantErr(t, err, apierror.PayloadTooLarge, `"z16"`, "limit of 16777216 bytes")
	})
}

func half(b []byte) []byte { return b[:len(b)/2] }

// Deep paths and deep symlink targets cost bounded work: shared parents are walked once, and
// the walking of symlink targets has a budget.
func TestArchiveCostlyPaths(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	deep := strings.Repeat("a/", 2000) // 4000 bytes, 2000 components
	t.Run("DeepNames", func(t *testing.T) {
		var es []ent
		for i := range 500 {
			es = append(es, reg(fmt.Sprintf("%sf%d", deep, i), "x"))
		}
		start := time.Now()
		got, err := fetch(t, f, s.put("/deep/names", gzipBytes(t, tarBytes(t, es))))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2000+500 {
			t.Errorf("got %d entries, want 2500 (2000 directories, 500 files)", len(got))
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("took %v, want well under 20s", d)
		}
	})
	t.Run("DeepTargets", func(t *testing.T) {
		var es []ent
		for i := range 1000 {
			es = append(es, symlink(fmt.Sprintf("l%d", i), deep+"x"))
		}
		start := time.Now()
		_, err := fetch(t, f, s.put("/deep/targets", gzipBytes(t, tarBytes(t, es))))
		wantErr(t, err, apierror.PayloadTooLarge, "symlink targets")
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("took %v, want it refused quickly", d)
		}
	})
}
