package ocilayout

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link, data string
	typ              byte
	mode             int64
}

// writeLayout writes an OCI layout of one image named ref with one gzip layer per entry list,
// and returns its folder.
func writeLayout(t *testing.T, ref string, layers ...[]entry) string {
	t.Helper()
	dir := t.TempDir()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) string {
		sum := sha256.Sum256(b)
		h := hex.EncodeToString(sum[:])
		if err := os.WriteFile(filepath.Join(blobs, h), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + h
	}
	var m manifest
	m.MediaType = mediaManifest
	for _, es := range layers {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		for _, e := range es {
			h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.data))}
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			if e.typ != tar.TypeReg {
				h.Size = 0
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if e.typ == tar.TypeReg {
				tw.Write([]byte(e.data))
			}
		}
		tw.Close()
		zw.Close()
		m.Layers = append(m.Layers, descriptor{MediaType: mediaLayerGz, Digest: put(buf.Bytes()), Size: int64(buf.Len())})
	}
	mb, _ := json.Marshal(m)
	idx := index{Manifests: []descriptor{{MediaType: mediaManifest, Digest: put(mb), Size: int64(len(mb)),
		Annotations: map[string]string{RefName: ref}}}}
	ib, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestUnpackLayers(t *testing.T) {
	layout := writeLayout(t, "sandboxd/base:1",
		[]entry{
			{name: "usr/", typ: tar.TypeDir, mode: 0o755},
			{name: "usr/bin/bash", typ: tar.TypeReg, mode: 0o755, data: "bash"},
			{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
			{name: "usr/bin/sh", typ: tar.TypeLink, link: "usr/bin/bash"},
			{name: "etc/gone", typ: tar.TypeReg, data: "x"},
			{name: "opt/old/a", typ: tar.TypeReg, data: "a"},
			{name: "/etc/abs", typ: tar.TypeReg, data: "abs"}, // absolute names land inside
		},
		[]entry{
			{name: "etc/.wh.gone", typ: tar.TypeReg},
			{name: "opt/old/.wh..wh..opq", typ: tar.TypeReg},
			{name: "opt/old/b", typ: tar.TypeReg, data: "b"},
			{name: ".sbx/init", typ: tar.TypeReg, mode: 0o755, data: "init"},
		})
	into := t.TempDir()
	got, err := Unpack(layout, into)
	if err != nil {
		t.Fatal(err)
	}
	root := got["sandboxd/base:1"]
	if root == "" || len(got) != 1 {
		t.Fatalf("Unpack: got %v, want sandboxd/base:1", got)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{"bin/bash": "bash", "usr/bin/sh": "bash", ".sbx/init": "init", "etc/abs": "abs", "opt/old/b": "b"} {
		if g := read(p); g != want {
			t.Errorf("%s: got %q, want %q", p, g, want)
		}
	}
	for _, p := range []string{"etc/gone", "opt/old/a", "etc/.wh.gone"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s: exists, want it whited out", p)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, ".sbx/init")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf(".sbx/init: got %v %v, want mode 0755", fi, err)
	}
	// A second call finds the folder complete and unpacks nothing.
	again, err := Unpack(layout, into)
	if err != nil || again["sandboxd/base:1"] != root {
		t.Errorf("second Unpack: got %v %v, want %s", again, err, root)
	}
	if ents, _ := os.ReadDir(root); len(ents) == 0 || strings.HasPrefix(ents[0].Name(), ".ocilayout") {
		t.Errorf("the image root holds %v", ents)
	}
}

// A hostile layer cannot write outside its folder: not with "..", not through a symbolic link
// it made, not with a hard link to a file outside; a blob whose bytes do not match its digest
// is refused.
func TestUnpackHostile(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string][]entry{
		"dotdot":       {{name: "../../../../" + strings.TrimPrefix(victim, "/"), typ: tar.TypeReg, data: "pwned"}},
		"inner-dotdot": {{name: "a/../../x", typ: tar.TypeReg, data: "pwned"}},
		"through-link": {
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			{name: "esc/victim", typ: tar.TypeReg, data: "pwned"},
		},
		"relative-link": {
			{name: "esc", typ: tar.TypeSymlink, link: "../../../../../../" + strings.TrimPrefix(outside, "/")},
			{name: "esc/victim", typ: tar.TypeReg, data: "pwned"},
		},
		"hardlink-out": {{name: "h", typ: tar.TypeLink, link: "../../../../../../" + strings.TrimPrefix(victim, "/")}},
		"device":       {{name: "dev/sda", typ: tar.TypeBlock}},
	}
	for name, es := range tests {
		t.Run(name, func(t *testing.T) {
			layout := writeLayout(t, "evil:1", es)
			if _, err := Unpack(layout, t.TempDir()); err == nil {
				t.Errorf("Unpack: got no error, want the layer refused")
			}
			if b, _ := os.ReadFile(victim); string(b) != "safe" {
				t.Fatalf("the file outside got %q", b)
			}
			if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
				t.Fatalf("a file was written outside")
			}
		})
	}
	t.Run("corrupt-blob", func(t *testing.T) {
		layout := writeLayout(t, "evil:1", []entry{{name: "a", typ: tar.TypeReg, data: "a"}})
		blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
		for _, b := range blobs { // flip a byte of the layer (the biggest blob is not the manifest here: any will do)
			data, _ := os.ReadFile(b)
			if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
				data[len(data)-5] ^= 0xff
				os.WriteFile(b, data, 0o644)
			}
		}
		if _, err := Unpack(layout, t.TempDir()); err == nil {
			t.Errorf("Unpack of a corrupt layer: got no error")
		}
	})
}
