// Package openapitest (test-only) checks HTTP traffic against the REST API's OpenAPI document
// (internal/rest's openapi.yaml, served at GET /openapi.json) with kin-openapi, so that the
// document cannot drift from what the server does. Spec.Transport wraps a client's
// RoundTripper and reports every mismatch of a REST exchange (a path under /sandbox/):
//
//   - a path or method the document does not have must be answered 404 (or 405) in the error
//     body; anything else is an undocumented route;
//   - a request the document refuses (an unknown member, a missing parameter, a value out of
//     its schema, no key) must be refused by the server with a documented 4xx: a hostile test
//     sends such requests on purpose, and the server accepting one is a drift;
//   - every answer must have a status the operation documents, its documented headers, a
//     documented content type and, for JSON, a body that matches the schema (the document's
//     schemas refuse unknown members, so a new field must be documented first);
//   - streams are checked on their status and headers (a WebSocket's connection passes
//     through untouched), and each Server-Sent Event's data against the schema its event name
//     has in the response's x-sse-events, as the caller reads the stream.
//
// CORS preflights (OPTIONS with Access-Control-Request-Method) are the browser's negotiation,
// answered before the API, and HEAD requests have no body to check: they pass unchecked.
package openapitest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"sandboxd/internal/rest"
)

// Spec is a parsed and validated OpenAPI 3.1 document with its router. It is safe for
// concurrent use.
type Spec struct {
	doc    *openapi3.T
	router routers.Router
}

// Report is told about one mismatch: the request (its body already read), the answer's status
// and what is wrong. It may be called from any goroutine, also while a stream is read.
type Report func(req *http.Request, status int, problem string)

// maxCheckedBody bounds the request bodies read for validation; a longer one (a test of the
// server's own bound) is sent on unread past this, its body unchecked.
const maxCheckedBody = 16 << 20

// Parse parses an OpenAPI document (JSON or YAML) and checks that it is a valid OpenAPI 3.1
// document. Its servers are dropped: requests are routed whatever their host.
func Parse(raw []byte) (*Spec, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("loading the OpenAPI document: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("not a valid OpenAPI document: %w", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		return nil, fmt.Errorf("the document is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("routing the document's paths: %w", err)
	}
	return &Spec{doc: doc, router: router}, nil
}

var embedded = sync.OnceValues(func() (*Spec, error) {
	raw, err := rest.OpenAPIDocument()
	if err != nil {
		return nil, err
	}
	return Parse(raw)
})

// Embedded is the document internal/rest serves, parsed once.
func Embedded() (*Spec, error) { return embedded() }

// Doc is the parsed document (read it, do not change it).
func (sp *Spec) Doc() *openapi3.T { return sp.doc }

// isREST reports whether a path is one of the REST API's (the document's domain).
func isREST(path string) bool { return strings.HasPrefix(path, "/sandbox/") }

// Transport wraps base (nil: http.DefaultTransport) so that every REST exchange through it is
// checked against the document, each mismatch told to report.
func (sp *Spec) Transport(base http.RoundTripper, report Report) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{spec: sp, base: base, report: report}
}

// transport validates the REST exchanges it carries.
type transport struct {
	spec   *Spec
	base   http.RoundTripper
	report Report
}

func (c *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !isREST(req.URL.Path) || req.Method == http.MethodHead ||
		(req.Method == http.MethodOptions && req.Header.Get("Access-Control-Request-Method") != "") {
		return c.base.RoundTrip(req)
	}
	route, params, routeErr := c.spec.router.FindRoute(req)
	// The request as the validator sees it: its body only when the operation's schema reads it
	// (or when the body's type is not one the operation takes, to say so); raw bytes (a file,
	// stdin) are sent on unread.
	vreq := req.Clone(req.Context())
	vreq.Body, vreq.GetBody = http.NoBody, nil
	bodyUnread := false
	if routeErr == nil && route.Operation.RequestBody != nil && req.Body != nil && req.Body != http.NoBody {
		media := route.Operation.RequestBody.Value.Content.Get(req.Header.Get("Content-Type"))
		if media == nil || media.Schema != nil {
			body, whole, err := readBounded(req.Body, maxCheckedBody)
			if err != nil {
				return nil, err
			}
			sent := req.Clone(req.Context())
			if whole {
				req.Body.Close()
				sent.Body = io.NopCloser(bytes.NewReader(body))
				sent.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
				vreq.Body = io.NopCloser(bytes.NewReader(body))
			} else {
				bodyUnread = true
				sent.Body = struct {
					io.Reader
					io.Closer
				}{io.MultiReader(bytes.NewReader(body), req.Body), req.Body}
				sent.GetBody = nil
			}
			req = sent
		}
	}
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if routeErr != nil {
		return c.checkUnrouted(vreq, resp, routeErr)
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: requestOptions(vreq)}
	in.Options.ExcludeRequestBody = bodyUnread
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil && (resp.StatusCode < 400 || resp.StatusCode >= 500) {
		c.report(vreq, resp.StatusCode, "the server accepted a request the document refuses: "+oneLine(err))
	}
	return c.checkResponse(in, resp, route)
}

// requestOptions are the validator's options: a documented key must be there (its value is the
// server's to judge), defaults are not written into the body, and a body where the operation
// takes none is refused.
func requestOptions(req *http.Request) *openapi3filter.Options {
	opts := &openapi3filter.Options{SkipSettingDefaults: true, RejectWhenRequestBodyNotSpecified: true, MultiError: true}
	opts.AuthenticationFunc = func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
		if sc := in.SecurityScheme; sc.Type == "apiKey" && sc.In == "header" && req.Header.Get(sc.Name) == "" {
			return in.NewError(fmt.Errorf("no %s header", sc.Name))
		}
		return nil
	}
	return opts
}

// checkUnrouted checks the answer to a request the document has no operation for: it must be
// the server's NOT_FOUND (or a 405) in the error body.
func (c *transport) checkUnrouted(req *http.Request, resp *http.Response, routeErr error) (*http.Response, error) {
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return resp, err
	}
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		c.report(req, resp.StatusCode, fmt.Sprintf("the document has no such operation (%v), yet the server did not answer 404", routeErr))
		return resp, nil
	}
	if err := c.spec.CheckError(resp.Header, body); err != nil {
		c.report(req, resp.StatusCode, err.Error())
	}
	return resp, nil
}

// CheckError checks an answer against the error body's schema.
func (sp *Spec) CheckError(h http.Header, body []byte) error {
	if !isJSON(h.Get("Content-Type")) {
		return fmt.Errorf("got Content-Type %q, want the JSON error body", h.Get("Content-Type"))
	}
	return sp.CheckJSON("Error", body)
}

// CheckJSON checks a JSON value against the document's schema of that name.
func (sp *Spec) CheckJSON(schema string, data []byte) error {
	sc := sp.doc.Components.Schemas[schema]
	if sc == nil {
		return fmt.Errorf("the document has no schema %q", schema)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	if err := sc.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		return fmt.Errorf("does not match the schema %s: %s", schema, oneLine(err))
	}
	return nil
}

// checkResponse validates an answer: its status, headers and content type always, a JSON body
// whole (read here and handed on), and a Server-Sent Events body event by event as the caller
// reads it. A WebSocket's connection passes through untouched.
func (c *transport) checkResponse(in *openapi3filter.RequestValidationInput, resp *http.Response, route *routers.Route) (*http.Response, error) {
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	ct := resp.Header.Get("Content-Type")
	if isJSON(ct) && resp.StatusCode != http.StatusSwitchingProtocols {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err != nil {
			return resp, err
		}
		out.SetBodyBytes(body)
	} else {
		// The document gives these no schema (bytes, streams): status, headers and type only.
		out.SetBodyBytes(nil)
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		c.report(in.Request, resp.StatusCode, "the answer does not match the document: "+oneLine(err))
	}
	if mt, _, _ := mime.ParseMediaType(ct); mt == "text/event-stream" && resp.StatusCode == http.StatusOK {
		if r := route.Operation.Responses.Status(http.StatusOK); r != nil {
			if media := r.Value.Content.Get(ct); media != nil {
				resp.Body = &sseChecker{t: c, req: in.Request, events: c.spec.sseEvents(media), body: resp.Body}
			}
		}
	}
	return resp, nil
}

// sseEvents resolves a media type's x-sse-events: event name → the schema of its data.
func (sp *Spec) sseEvents(media *openapi3.MediaType) map[string]*openapi3.Schema {
	out := map[string]*openapi3.Schema{}
	raw, _ := media.Extensions["x-sse-events"].(map[string]any)
	for name, v := range raw {
		m, _ := v.(map[string]any)
		ref, _ := m["$ref"].(string)
		if sc := sp.doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")]; sc != nil {
			out[name] = sc.Value
		}
	}
	return out
}

// sseChecker validates each Server-Sent Event as its reader reads the stream.
type sseChecker struct {
	t      *transport
	req    *http.Request
	events map[string]*openapi3.Schema
	body   io.ReadCloser
	line   []byte
	event  string
	data   []string
}

func (c *sseChecker) Read(p []byte) (int, error) {
	n, err := c.body.Read(p)
	for _, b := range p[:n] {
		if b != '\n' {
			c.line = append(c.line, b)
			continue
		}
		c.takeLine(strings.TrimSuffix(string(c.line), "\r"))
		c.line = c.line[:0]
	}
	return n, err
}

func (c *sseChecker) Close() error { return c.body.Close() }

// takeLine takes one line of the stream; a blank line dispatches the event it ends.
func (c *sseChecker) takeLine(line string) {
	if line == "" {
		if c.event != "" || len(c.data) > 0 {
			c.check(cmp.Or(c.event, "message"), strings.Join(c.data, "\n"))
		}
		c.event, c.data = "", nil
		return
	}
	field, value, _ := strings.Cut(line, ":")
	value = strings.TrimPrefix(value, " ")
	switch field {
	case "event":
		c.event = value
	case "data":
		c.data = append(c.data, value)
	}
}

func (c *sseChecker) check(event, data string) {
	schema, ok := c.events[event]
	if !ok {
		c.t.report(c.req, http.StatusOK, fmt.Sprintf("the stream sent an event %q that the document does not list", event))
		return
	}
	var v any
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		c.t.report(c.req, http.StatusOK, fmt.Sprintf("event %q: its data is not JSON: %v", event, err))
		return
	}
	if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		c.t.report(c.req, http.StatusOK, fmt.Sprintf("event %q does not match its schema: %s (data %.300s)", event, oneLine(err), data))
	}
}

// readBounded reads r up to n bytes: all of it (whole) or the first n+1 (not whole).
func readBounded(r io.Reader, n int64) (data []byte, whole bool, err error) {
	data, err = io.ReadAll(io.LimitReader(r, n+1))
	if err != nil {
		return nil, false, err
	}
	return data, int64(len(data)) <= n, nil
}

func isJSON(ct string) bool {
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// oneLine shortens a validator's message (which may quote schemas over many lines).
func oneLine(err error) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(err.Error()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	msg := strings.Join(lines, " | ")
	if len(msg) > 1500 {
		msg = msg[:1500] + "…"
	}
	return msg
}

// Violations collects the mismatches a Transport reports, for a test to check.
type Violations struct {
	mu   sync.Mutex
	list []string
}

// Report is a Report that keeps the mismatch.
func (v *Violations) Report(req *http.Request, status int, problem string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, Format(req, status, problem))
}

// List answers the mismatches so far.
func (v *Violations) List() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.list...)
}

// Format is one mismatch as a line: "OpenAPI: METHOD /path?query → status: problem".
func Format(req *http.Request, status int, problem string) string {
	return fmt.Sprintf("OpenAPI: %s %s → %d: %s", req.Method, req.URL.RequestURI(), status, problem)
}
