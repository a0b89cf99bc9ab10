package e2e

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"

	"sandboxd/internal/rest/openapitest"
)

// The REST traffic of the tests is checked against the OpenAPI document the server serves at
// GET /openapi.json (internal/rest/openapitest says how), so that the document cannot drift
// from what the server does. Every REST exchange that goes through the harness is checked:
// Send, SendVia, Curl and the calls built on them, Server.Client, Server.HTTPClient (for the
// tests' own streams and WebSockets), and sandboxctl, whose gateway (Server.CtlEnv) is a
// checking proxy. A mismatch fails the test that made it (Server.Violations lists them).

// specs caches the parsed document by its bytes: every server of a test run serves the same.
var specs struct {
	sync.Mutex
	raw  []byte
	spec *openapitest.Spec
}

// loadSpec fetches the server's OpenAPI document (without a key: it needs none) and parses it,
// once per distinct document.
func (s *Server) loadSpec() (*openapitest.Spec, error) {
	resp, err := http.Get(s.URL + "/openapi.json")
	if err != nil {
		return nil, fmt.Errorf("GET /openapi.json: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /openapi.json: %w", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		return nil, fmt.Errorf("GET /openapi.json without a key: got %d %s %.200s, want 200 application/json",
			resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	specs.Lock()
	defer specs.Unlock()
	if specs.spec != nil && bytes.Equal(specs.raw, raw) {
		return specs.spec, nil
	}
	spec, err := openapitest.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("/openapi.json: %w", err)
	}
	specs.raw, specs.spec = raw, spec
	return spec, nil
}

// violation records one mismatch and fails the server's test with it (while it runs).
func (s *Server) violation(req *http.Request, status int, problem string) {
	msg := openapitest.Format(req, status, problem)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, msg)
	if !s.checksDone {
		s.t.Error(msg)
	}
}

// Violations are the mismatches between this server's REST traffic and its OpenAPI document
// so far (each also failed the test when it happened).
func (s *Server) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// Transport wraps base (nil: http.DefaultTransport) so that every REST exchange through it is
// checked against the server's OpenAPI document.
func (s *Server) Transport(base http.RoundTripper) http.RoundTripper {
	return s.spec.Transport(base, s.violation)
}

// HTTPClient is an http.Client without a timeout (for streams) whose REST exchanges are
// checked against the server's OpenAPI document.
func (s *Server) HTTPClient() *http.Client {
	return &http.Client{Transport: s.Transport(nil)}
}

// checkedGateway answers the URL of a reverse proxy to the server, in the test process, whose
// REST exchanges are checked: the gateway that programs started by the test (sandboxctl) are
// pointed at. It is started on first use and closed when the test ends.
func (s *Server) checkedGateway() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gateway == nil {
		target, err := url.Parse(s.URL)
		if err != nil {
			panic(err)
		}
		proxy := &httputil.ReverseProxy{
			Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
			Transport:     s.Transport(&http.Transport{}),
			FlushInterval: -1,
			ErrorLog:      log.New(io.Discard, "", 0),
		}
		gw := httptest.NewServer(proxy)
		s.gateway = gw
		s.t.Cleanup(func() {
			gw.CloseClientConnections()
			gw.Close()
		})
	}
	return s.gateway.URL
}
