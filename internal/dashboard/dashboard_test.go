package dashboard

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDistFresh: the embedded build is the build of the sources in web/: dist/source.sha256
// is the hash build.mjs computed over them, and this computes the same ("path\0size\0bytes"
// for each source file, in order). A change under web/ without scripts/build-dashboard.sh
// fails here.
func TestDistFresh(t *testing.T) {
	files := []string{"build.mjs", "package.json", "package-lock.json", "tsconfig.json"}
	err := filepath.WalkDir("web/src", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel("web", path)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("web", f))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(b))
		h.Write(b)
	}
	want := hex.EncodeToString(h.Sum(nil))
	got, err := dist.ReadFile("dist/source.sha256")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Errorf("dist/ was built from other sources (got %s, the sources hash to %s): run scripts/build-dashboard.sh and commit dist/",
			strings.TrimSpace(string(got)), want)
	}
}

func newSite(t *testing.T) *Site {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func serve(h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func mux(s *Site) *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /{$}", s.Index())
	m.Handle("GET /graphiql", s.GraphiQL())
	m.Handle("GET /ui/{asset}", s.Assets())
	return m
}

// TestPages: each page is HTML with its policy and the security headers, revalidated on every
// load; every file it names under /ui/ is served, with a year's caching; nothing else is.
func TestPages(t *testing.T) {
	s := newSite(t)
	m := mux(s)
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`)
	for _, tt := range []struct{ path, csp string }{{"/", DashboardCSP}, {"/graphiql", GraphiQLCSP}} {
		t.Run(strings.Trim(tt.path, "/")+"page", func(t *testing.T) {
			w := serve(m, "GET", tt.path)
			if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
				t.Fatalf("got %d %s, want 200 text/html", w.Code, w.Header().Get("Content-Type"))
			}
			for k, v := range map[string]string{
				"Content-Security-Policy": tt.csp, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
				"X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
			} {
				if got := w.Header().Get(k); got != v {
					t.Errorf("%s: got %q, want %q", k, got, v)
				}
			}
			page := w.Body.String()
			if strings.Contains(page, "<script>") || regexp.MustCompile(`<script[^>]*>[^<]`).MatchString(page) {
				t.Error("the page has an inline script")
			}
			n := 0
			for _, m2 := range refs.FindAllStringSubmatch(page, -1) {
				ref := m2[1]
				if ref == "data:," { // the empty favicon
					continue
				}
				if !strings.HasPrefix(ref, "/ui/") {
					t.Errorf("the page refers to %q, want only files under /ui/", ref)
					continue
				}
				n++
				a := serve(m, "GET", ref)
				if a.Code != 200 || a.Body.Len() == 0 {
					t.Errorf("%s: got %d with %d bytes, want the file", ref, a.Code, a.Body.Len())
				}
				if got := a.Header().Get("Cache-Control"); got != "public, max-age=31536000, immutable" {
					t.Errorf("%s: got Cache-Control %q, want a year, immutable", ref, got)
				}
			}
			if n != 2 {
				t.Errorf("got %d files under /ui/ in the page, want its script and its sheet", n)
			}
		})
	}
	for _, p := range []string{"/ui/nothing.js", "/ui/..%2findex.html", "/ui/%2e%2e"} {
		if w := serve(m, "GET", p); w.Code != 404 {
			t.Errorf("GET %s: got %d, want 404", p, w.Code)
		}
	}
}

// TestConditionalAndCompressed: an ETag answers If-None-Match with 304; a client that takes gzip
// gets the script compressed (its own ETag), one that does not, or refuses it with q=0, the bytes.
func TestConditionalAndCompressed(t *testing.T) {
	s := newSite(t)
	var script *file
	for name, f := range s.assets {
		if strings.HasSuffix(name, ".js") {
			script = f
			break
		}
	}
	if script == nil {
		t.Fatal("no script in the build")
	}
	m := mux(s)
	target := "/ui/" + script.name[len("ui/"):]

	plain := serve(m, "GET", target)
	if plain.Header().Get("Content-Encoding") != "" || !bytes.Equal(plain.Body.Bytes(), script.body) {
		t.Fatalf("got Content-Encoding %q and %d bytes, want the file's %d bytes", plain.Header().Get("Content-Encoding"), plain.Body.Len(), len(script.body))
	}
	if w := serve(m, "GET", target, "If-None-Match", plain.Header().Get("ETag")); w.Code != http.StatusNotModified || w.Body.Len() != 0 {
		t.Errorf("If-None-Match: got %d with %d bytes, want 304", w.Code, w.Body.Len())
	}

	gz := serve(m, "GET", target, "Accept-Encoding", "br, gzip;q=0.8")
	if gz.Header().Get("Content-Encoding") != "gzip" || gz.Header().Get("ETag") == plain.Header().Get("ETag") {
		t.Fatalf("got Content-Encoding %q ETag %q, want gzip with an ETag of its own", gz.Header().Get("Content-Encoding"), gz.Header().Get("ETag"))
	}
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil || !bytes.Equal(got, script.body) {
		t.Errorf("the gzip answer unpacks to %d bytes (%v), want the file's %d", len(got), err, len(script.body))
	}
	if gz.Body.Len() >= len(script.body) {
		t.Errorf("gzip: %d bytes, want fewer than %d", gz.Body.Len(), len(script.body))
	}
	if w := serve(m, "GET", target, "Accept-Encoding", "gzip;q=0"); w.Header().Get("Content-Encoding") != "" {
		t.Error("gzip;q=0: got a compressed answer")
	}
	if w := serve(m, "HEAD", target); w.Code != 200 || w.Body.Len() != 0 {
		t.Errorf("HEAD: got %d with %d bytes, want 200 without a body", w.Code, w.Body.Len())
	}
}

// TestAcceptsGzip: the Accept-Encoding forms a browser and a proxy send.
func TestAcceptsGzip(t *testing.T) {
	for _, tt := range []struct {
		header string
		want   bool
	}{
		{"", false}, {"gzip", true}, {"gzip, deflate, br, zstd", true}, {"br;q=1.0, GZIP;q=0.5", true},
		{"gzip;q=0", false}, {"gzip; q=0.000", false}, {"identity", false}, {"x-gzip", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if tt.header != "" {
			r.Header.Set("Accept-Encoding", tt.header)
		}
		if got := acceptsGzip(r); got != tt.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}
