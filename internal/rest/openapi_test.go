package rest

import (
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/apierror"
)

// loadOpenAPI parses and validates the served document as an OpenAPI 3.1 document.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	raw, err := OpenAPIDocument()
	if err != nil {
		t.Fatalf("the embedded document is not valid YAML: %v", err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("loading the document: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("the document is not a valid OpenAPI document: %v", err)
	}
	return doc
}

// TestOpenAPIDocument: the document is a valid OpenAPI 3.1 document, every operation has a
// unique operationId and documents, in the error body, the errors every call can get.
func TestOpenAPIDocument(t *testing.T) {
	doc := loadOpenAPI(t)
	if doc.OpenAPI != "3.1.0" || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("got openapi %q, want 3.1.0", doc.OpenAPI)
	}
	ids := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			if op.OperationID == "" {
				t.Errorf("%s has no operationId", where)
			} else if other, ok := ids[op.OperationID]; ok {
				t.Errorf("%s and %s share the operationId %q", where, other, op.OperationID)
			}
			ids[op.OperationID] = where
			// What any call can be answered: malformed scope headers, no key, scope headers
			// from a key that is not a platform key, the key's rate limit, a bug, Redis away.
			for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
				http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable} {
				r := op.Responses.Status(status)
				if r == nil || r.Value.Content.Get("application/json") == nil ||
					r.Value.Content.Get("application/json").Schema.Ref != "#/components/schemas/Error" {
					t.Errorf("%s: got no %d answer with the error body", where, status)
				}
			}
		}
	}
}

// TestOpenAPIRoutes: every route of the handler's table is an operation of the document, with
// the same method, path and wildcard names, and the document has no other operation.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	slices.Sort(documented)
	routes := slices.Sorted(maps.Keys(newTestHandler(t, apitest.New()).routes))
	for _, r := range routes {
		if !slices.Contains(documented, r) {
			t.Errorf("route %q is not in openapi.yaml", r)
		}
	}
	for _, d := range documented {
		if !slices.Contains(routes, d) {
			t.Errorf("openapi.yaml documents %q, which is no route of the handler", d)
		}
	}
}

// TestOpenAPIErrorCodes: the document's error codes are exactly internal/apierror's.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	var documented []string
	for _, v := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		documented = append(documented, v.(string))
	}
	var codes []string
	for _, c := range apierror.Codes() {
		codes = append(codes, string(c))
	}
	slices.Sort(documented)
	slices.Sort(codes)
	if !slices.Equal(documented, codes) {
		t.Errorf("the document's ErrorCode enum is %v, want internal/apierror's %v", documented, codes)
	}
}

// TestOpenAPIHandler: GET /openapi.json answers the document as JSON without a key, with an
// ETag that a revalidation answers 304 to; other methods are refused.
func TestOpenAPIHandler(t *testing.T) {
	h := OpenAPIHandler(slog.New(slog.DiscardHandler))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, OpenAPIPath, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("got Content-Type %q, want application/json", ct)
	}
	want, _ := OpenAPIDocument()
	if rec.Body.String() != string(want) {
		t.Errorf("got a body of %d bytes, want the document's %d", rec.Body.Len(), len(want))
	}
	var v struct {
		OpenAPI string `json:"openapi"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || v.OpenAPI != "3.1.0" {
		t.Errorf("got openapi %q (%v), want 3.1.0", v.OpenAPI, err)
	}
	etag := rec.Header().Get("ETag")
	if !strings.HasPrefix(etag, `"`) || len(etag) < 10 {
		t.Fatalf("got ETag %q, want a quoted hash", etag)
	}
	req := httptest.NewRequest(http.MethodGet, OpenAPIPath, nil)
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
		t.Errorf("revalidation: got %d with %d bytes, want 304 and none", rec.Code, rec.Body.Len())
	}
}

// TestOpenAPIMatchesREADME: the calls of the README's REST reference (and of its agent runs
// table) are exactly the document's operations, and the status each row answers first is one
// the operation documents.
func TestOpenAPIMatchesREADME(t *testing.T) {
	doc := loadOpenAPI(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	call := regexp.MustCompile("^`(GET|POST|PUT|PATCH|DELETE)(?:` \\(or `(POST)`\\) `| )(/sandbox/[^`?]*)[^`]*`$")
	firstStatus := regexp.MustCompile(`\b[1-5][0-9]{2}\b`)
	readmeCalls := map[string]bool{}
	for line := range strings.Lines(string(readme)) {
		// The cells of a table row (a cell may hold an escaped \|).
		cells := strings.Split(strings.ReplaceAll(strings.TrimSpace(line), `\|`, "\x00"), "|")
		if len(cells) != 5 {
			continue
		}
		m := call.FindStringSubmatch(strings.TrimSpace(cells[1]))
		if m == nil {
			continue
		}
		for _, method := range []string{m[1], m[2]} {
			if method == "" {
				continue
			}
			name := method + " " + m[3]
			readmeCalls[name] = true
			item := doc.Paths.Find(m[3])
			if item == nil || item.GetOperation(method) == nil {
				t.Errorf("README call %q is not in openapi.yaml", name)
				continue
			}
			if st := firstStatus.FindString(cells[3]); st != "" {
				status, _ := strconv.Atoi(st)
				if item.GetOperation(method).Responses.Status(status) == nil {
					t.Errorf("README call %q answers %d, which openapi.yaml does not document", name, status)
				}
			}
		}
	}
	if len(readmeCalls) < 30 {
		t.Fatalf("found %d calls in the README's tables, want the whole REST reference", len(readmeCalls))
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !readmeCalls[method+" "+path] {
				t.Errorf("openapi.yaml documents %s %s, which the README's REST reference does not", method, path)
			}
		}
	}
}
