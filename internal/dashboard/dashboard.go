// Package dashboard serves sandboxd's built-in web pages: the dashboard at / and GraphiQL at
// /graphiql, with their scripts and styles under /ui/. The pages are static files built from
// web/ (TypeScript: preact, xterm.js, GraphiQL) by scripts/build-dashboard.sh into dist/,
// committed, and embedded in the binary: nothing is loaded from another origin, so they work
// in an air-gapped cluster. The pages hold no key: the browser keeps it in session storage
// and sends it to the API itself (X-Api-Key, the WebSocket's first message), so these routes
// need none.
//
// Every answer carries a Content-Security-Policy that allows scripts and styles from this
// origin only (no inline script, no eval) and connections only back to it; the pages' file
// names carry a hash of their content, so /ui/ files are cached for a year and the pages are
// revalidated (ETag) on every load.
package dashboard

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed dist
var dist embed.FS

// The policies of the pages. Scripts come from this origin only, on both: no inline script,
// no eval. The dashboard's styles come from its sheet, except the two <style> elements that
// xterm.js's renderer writes (the cell size and the theme: style-src-elem 'unsafe-inline');
// style attributes are refused (style-src-attr 'none': the pages set styles through the
// CSSOM, which CSP does not govern), so markup could not style itself even if some got in.
// GraphiQL's editor (CodeMirror) and React components write style attributes and its sheet
// carries its fonts as data: URLs, so its page allows inline styles and data: fonts.
// tests/dashboard_test.go fails on any violation of either policy in a real Chromium.
const (
	DashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; style-src-elem 'self' 'unsafe-inline'; " +
		"style-src-attr 'none'; img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; " +
		"form-action 'none'; frame-ancestors 'none'"
	GraphiQLCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
		"font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

// Site serves the embedded pages.
type Site struct {
	index, graphiql *file
	assets          map[string]*file // by name under ui/
}

// file is one embedded file with what its answers need.
type file struct {
	name, ctype, etag string
	body              []byte
	immutable         bool
	csp               string

	gzOnce sync.Once
	gz     []byte // the gzip form, when it is smaller; made on first use
}

// New loads the embedded files. It fails only when the embedded build is incomplete (a build
// of this package without scripts/build-dashboard.sh's output).
func New() (*Site, error) {
	s := &Site{assets: map[string]*file{}}
	load := func(name, csp string, immutable bool) (*file, error) {
		b, err := dist.ReadFile("dist/" + name)
		if err != nil {
			return nil, fmt.Errorf("dashboard: the embedded build has no %s: run scripts/build-dashboard.sh", name)
		}
		sum := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(name))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		return &file{name: name, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, body: b, immutable: immutable, csp: csp}, nil
	}
	var err error
	if s.index, err = load("index.html", DashboardCSP, false); err != nil {
		return nil, err
	}
	if s.graphiql, err = load("graphiql.html", GraphiQLCSP, false); err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(dist, "dist/ui")
	if err != nil {
		return nil, fmt.Errorf("dashboard: the embedded build has no ui folder: run scripts/build-dashboard.sh")
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		f, err := load("ui/"+e.Name(), DashboardCSP, true)
		if err != nil {
			return nil, err
		}
		s.assets[e.Name()] = f
	}
	return s, nil
}

// Index serves the dashboard's page (mount it at GET /{$}).
func (s *Site) Index() http.Handler { return s.index }

// GraphiQL serves the GraphiQL page for /graphql (mount it at GET /graphiql).
func (s *Site) GraphiQL() http.Handler { return s.graphiql }

// Assets serves the pages' scripts and styles (mount it at GET /ui/{asset}); any other name is 404.
func (s *Site) Assets() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := s.assets[r.PathValue("asset")]
		if !ok {
			setSecurityHeaders(w.Header(), DashboardCSP)
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		f.ServeHTTP(w, r)
	})
}

func setSecurityHeaders(h http.Header, csp string) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=(), payment=()")
}

func (f *file) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	setSecurityHeaders(h, f.csp)
	h.Set("Content-Type", f.ctype)
	if f.immutable {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	h.Set("Vary", "Accept-Encoding")
	body, etag := f.body, f.etag
	if gz := f.gzipped(); gz != nil && acceptsGzip(r) {
		body, etag = gz, strings.TrimSuffix(f.etag, `"`)+`-gz"`
		h.Set("Content-Encoding", "gzip")
	}
	h.Set("ETag", etag)
	// ServeContent answers If-None-Match with 304, HEAD without a body, and ranges.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

// gzipped is the file's gzip form, or nil when compressing does not pay.
func (f *file) gzipped() []byte {
	f.gzOnce.Do(func() {
		if len(f.body) < 1024 {
			return
		}
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = zw.Write(f.body)
		if zw.Close() == nil && b.Len() < len(f.body)*9/10 {
			f.gz = b.Bytes()
		}
	})
	return f.gz
}

// acceptsGzip reports whether the request's Accept-Encoding takes gzip (and does not refuse it with q=0).
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if !strings.EqualFold(strings.TrimSpace(name), "gzip") {
				continue
			}
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}
