package resolvers

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/api/apitest"
	"sandboxd/internal/auth"
)

func TestNegotiate(t *testing.T) {
	const (
		jsonT = "application/json"
		grj   = "application/graphql-response+json"
	)
	tests := []struct {
		name   string
		accept []string
		want   mediaType
		wantOK bool
	}{
		{name: "none", want: mediaJSON, wantOK: true},
		{name: "empty", accept: []string{" "}, want: mediaJSON, wantOK: true},
		{name: "any", accept: []string{"*/*"}, want: mediaJSON, wantOK: true},
		{name: "application-any", accept: []string{"application/*"}, want: mediaJSON, wantOK: true},
		{name: "json", accept: []string{jsonT}, want: mediaJSON, wantOK: true},
		{name: "json-charset", accept: []string{"application/json; charset=utf-8"}, want: mediaJSON, wantOK: true},
		{name: "graphql-response", accept: []string{grj}, want: mediaGraphQLResponse, wantOK: true},
		{name: "recommended", accept: []string{grj + "; charset=utf-8, application/json; charset=utf-8"}, want: mediaGraphQLResponse, wantOK: true},
		{name: "json-listed-first", accept: []string{jsonT + ", " + grj}, want: mediaJSON, wantOK: true},
		{name: "q-prefers-json", accept: []string{grj + ";q=0.5, " + jsonT}, want: mediaJSON, wantOK: true},
		{name: "q-prefers-graphql-response", accept: []string{jsonT + ";q=0.9, " + grj}, want: mediaGraphQLResponse, wantOK: true},
		{name: "two-header-fields", accept: []string{jsonT + ";q=0.1", grj}, want: mediaGraphQLResponse, wantOK: true},
		{name: "specific-beats-wildcard", accept: []string{"*/*, " + jsonT + ";q=0"}, want: mediaGraphQLResponse, wantOK: true},
		{name: "wildcard-fallback", accept: []string{grj + ";q=0.2, */*;q=0.8"}, want: mediaJSON, wantOK: true},
		{name: "graphql-response-with-low-wildcard", accept: []string{grj + ", */*;q=0.1"}, want: mediaGraphQLResponse, wantOK: true},
		{name: "browser", accept: []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, want: mediaJSON, wantOK: true},
		{name: "graphiql", accept: []string{"application/json, multipart/mixed"}, want: mediaJSON, wantOK: true},
		{name: "html-only", accept: []string{"text/html"}},
		{name: "event-stream-only", accept: []string{"text/event-stream"}},
		{name: "all-refused", accept: []string{jsonT + ";q=0, " + grj + ";q=0"}},
		{name: "garbage", accept: []string{"nonsense"}},
		{name: "bad-q-ignored", accept: []string{jsonT + ";q=2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := negotiate(tt.accept)
			if ok != tt.wantOK || (ok && got != tt.want) {
				t.Errorf("negotiate(%q): got %s %v, want %s %v", tt.accept, mediaTypeNames[got], ok, mediaTypeNames[tt.want], tt.wantOK)
			}
		})
	}
}

// httpAnswer is a raw answer of the GraphQL endpoint.
type httpAnswer struct {
	status int
	header http.Header
	body   string
	// fields are the top-level keys of the body ("data" present or not).
	fields map[string]json.RawMessage
	errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	}
}

func (e *env) send(t *testing.T, method, target, contentType, accept, body string) httpAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(auth.HeaderAPIKey, apitest.UserKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := httpAnswer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
	if err := json.Unmarshal(raw, &a.fields); err != nil {
		t.Fatalf("%s %s: the answer is not a JSON object (status %d): %s", method, target, resp.StatusCode, raw)
	}
	if errs, ok := a.fields["errors"]; ok {
		if err := json.Unmarshal(errs, &a.errors); err != nil {
			t.Fatalf("errors: %v (%s)", err, errs)
		}
	}
	return a
}

func gqlBody(t *testing.T, fields map[string]any) string {
	t.Helper()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func getTarget(params map[string]string) string {
	v := url.Values{}
	for k, s := range params {
		v.Set(k, s)
	}
	return "/graphql?" + v.Encode()
}

// TestHTTPTransports checks the status, media type, body shape and error codes of plain HTTP
// requests against the GraphQL-over-HTTP spec.
func TestHTTPTransports(t *testing.T) {
	const (
		ct     = "application/json"
		jsonT  = "application/json"
		grj    = "application/graphql-response+json"
		secret = "SECRET-INPUT-7f3a" // in request input that no error may echo
	)
	var (
		ok          = gqlBody(t, map[string]any{"query": `{ profiles { name } }`})
		parseFail   = gqlBody(t, map[string]any{"query": `{ sandbox(id: "` + secret + `") `})
		validFail   = gqlBody(t, map[string]any{"query": `{ profiles { colour } }`})
		coerceFail  = gqlBody(t, map[string]any{"query": `query($id: ID!) { sandbox(id: $id) { id } }`, "variables": map[string]any{"id": nil}})
		unknownOp   = gqlBody(t, map[string]any{"query": `query A { profiles { name } }`, "operationName": "B"})
		notFound    = gqlBody(t, map[string]any{"query": `{ sandbox(id: "sbx_other") { id } }`})
		subscribe   = gqlBody(t, map[string]any{"query": `subscription { sandboxEvents { cursor } }`})
		allNulls    = gqlBody(t, map[string]any{"query": `{ profiles { name } }`, "operationName": nil, "variables": nil, "extensions": nil})
		named       = gqlBody(t, map[string]any{"query": `query Q { profiles { name } }`, "operationName": "Q", "extensions": map[string]any{"x": secret}})
		getQuery    = getTarget(map[string]string{"query": `query($id: ID!) { sandbox(id: $id) { id } }`, "variables": `{"id":"` + apitest.SandboxRunning + `"}`})
		getMutation = getTarget(map[string]string{"query": `mutation { stopSandbox(id: "` + apitest.SandboxRunning + `") { sandbox { id } } }`})
	)
	tests := []struct {
		name        string
		method      string
		target      string // default /graphql
		contentType string
		accept      string
		body        string
		wantStatus  int
		wantType    string // the response's media type; "" is application/json
		wantData    bool   // the body has a "data" entry
		wantCode    string // the first error's extensions.code; "" expects no error
		wantAllow   string
	}{
		{name: "ok-json", method: "POST", contentType: ct, accept: jsonT, body: ok, wantStatus: 200, wantData: true},
		{name: "ok-no-accept", method: "POST", contentType: ct, body: ok, wantStatus: 200, wantData: true},
		{name: "ok-any", method: "POST", contentType: ct, accept: "*/*", body: ok, wantStatus: 200, wantData: true},
		{name: "ok-graphql-response", method: "POST", contentType: ct, accept: grj, body: ok, wantStatus: 200, wantType: grj, wantData: true},
		{name: "ok-utf8-charset", method: "POST", contentType: ct + "; charset=UTF-8", body: ok, wantStatus: 200, wantData: true},
		{name: "null-optional-parameters", method: "POST", contentType: ct, accept: grj, body: allNulls, wantStatus: 200, wantType: grj, wantData: true},
		{name: "operation-name-and-extensions", method: "POST", contentType: ct, accept: grj, body: named, wantStatus: 200, wantType: grj, wantData: true},

		// Request errors: 200 with application/json, 400 with application/graphql-response+json;
		// never a data entry.
		{name: "parse-json", method: "POST", contentType: ct, accept: jsonT, body: parseFail, wantStatus: 200, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "parse-no-accept", method: "POST", contentType: ct, body: parseFail, wantStatus: 200, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "parse-graphql-response", method: "POST", contentType: ct, accept: grj, body: parseFail, wantStatus: 400, wantType: grj, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "validation-json", method: "POST", contentType: ct, accept: jsonT, body: validFail, wantStatus: 200, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "validation-graphql-response", method: "POST", contentType: ct, accept: grj, body: validFail, wantStatus: 400, wantType: grj, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "coercion-json", method: "POST", contentType: ct, accept: jsonT, body: coerceFail, wantStatus: 200, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "coercion-graphql-response", method: "POST", contentType: ct, accept: grj, body: coerceFail, wantStatus: 400, wantType: grj, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "unknown-operation-json", method: "POST", contentType: ct, accept: jsonT, body: unknownOp, wantStatus: 200, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "unknown-operation-graphql-response", method: "POST", contentType: ct, accept: grj, body: unknownOp, wantStatus: 400, wantType: grj, wantCode: "GRAPHQL_VALIDATION_FAILED"},
		{name: "subscription-json", method: "POST", contentType: ct, accept: jsonT, body: subscribe, wantStatus: 200, wantCode: "INVALID_ARGUMENT"},
		{name: "subscription-graphql-response", method: "POST", contentType: ct, accept: grj, body: subscribe, wantStatus: 400, wantType: grj, wantCode: "INVALID_ARGUMENT"},

		// A field error is a partial response: 200 with data in either media type.
		{name: "field-error-json", method: "POST", contentType: ct, accept: jsonT, body: notFound, wantStatus: 200, wantData: true, wantCode: "NOT_FOUND"},
		{name: "field-error-graphql-response", method: "POST", contentType: ct, accept: grj, body: notFound, wantStatus: 200, wantType: grj, wantData: true, wantCode: "NOT_FOUND"},

		// Requests that are not well-formed GraphQL-over-HTTP requests: 400 in either type.
		{name: "no-query", method: "POST", contentType: ct, accept: grj, body: `{"qeury":"{ profiles { name } }"}`, wantStatus: 400, wantType: grj, wantCode: "INVALID_ARGUMENT"},
		{name: "null-query", method: "POST", contentType: ct, body: `{"query":null}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "empty-body", method: "POST", contentType: ct, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "body-not-object", method: "POST", contentType: ct, body: `["` + secret + `"]`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "query-object", method: "POST", contentType: ct, body: `{"query":{"q":"` + secret + `"}}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "query-number", method: "POST", contentType: ct, accept: grj, body: `{"query":7}`, wantStatus: 400, wantType: grj, wantCode: "INVALID_ARGUMENT"},
		{name: "operation-name-array", method: "POST", contentType: ct, body: `{"query":"{ profiles { name } }","operationName":["` + secret + `"]}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "variables-string", method: "POST", contentType: ct, body: `{"query":"{ profiles { name } }","variables":"` + secret + `"}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "variables-array", method: "POST", contentType: ct, body: `{"query":"{ profiles { name } }","variables":[7]}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "extensions-boolean", method: "POST", contentType: ct, body: `{"query":"{ profiles { name } }","extensions":false}`, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},

		// Media types and methods.
		{name: "no-content-type", method: "POST", body: ok, wantStatus: 415, wantCode: "INVALID_ARGUMENT"},
		{name: "text-plain", method: "POST", contentType: "text/plain", body: ok, wantStatus: 415, wantCode: "INVALID_ARGUMENT"},
		{name: "latin1", method: "POST", contentType: ct + "; charset=latin1", body: ok, wantStatus: 415, wantCode: "INVALID_ARGUMENT"},
		{name: "not-acceptable", method: "POST", contentType: ct, accept: "text/html", body: ok, wantStatus: 406, wantCode: "INVALID_ARGUMENT"},
		{name: "put", method: "PUT", contentType: ct, body: ok, wantStatus: 405, wantCode: "INVALID_ARGUMENT", wantAllow: "GET, POST, OPTIONS"},

		// GET.
		{name: "get-ok", method: "GET", target: getQuery, accept: grj, wantStatus: 200, wantType: grj, wantData: true},
		{name: "get-ok-json", method: "GET", target: getQuery, wantStatus: 200, wantData: true},
		{name: "get-mutation", method: "GET", target: getMutation, accept: grj, wantStatus: 405, wantType: grj, wantCode: "INVALID_ARGUMENT", wantAllow: "POST"},
		{name: "get-mutation-json", method: "GET", target: getMutation, wantStatus: 405, wantCode: "INVALID_ARGUMENT", wantAllow: "POST"},
		{name: "get-subscription", method: "GET", target: getTarget(map[string]string{"query": `subscription { sandboxEvents { cursor } }`}), wantStatus: 405, wantCode: "INVALID_ARGUMENT", wantAllow: "POST"},
		{name: "get-no-query", method: "GET", accept: grj, wantStatus: 400, wantType: grj, wantCode: "INVALID_ARGUMENT"},
		{name: "get-parse-json", method: "GET", target: getTarget(map[string]string{"query": "{"}), accept: jsonT, wantStatus: 200, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "get-parse-graphql-response", method: "GET", target: getTarget(map[string]string{"query": "{"}), accept: grj, wantStatus: 400, wantType: grj, wantCode: "GRAPHQL_PARSE_FAILED"},
		{name: "get-variables-not-json", method: "GET", target: getTarget(map[string]string{"query": `{ profiles { name } }`, "variables": "{" + secret}), wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "get-variables-array", method: "GET", target: getTarget(map[string]string{"query": `{ profiles { name } }`, "variables": `["` + secret + `"]`}), wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "get-bad-escape", method: "GET", target: "/graphql?query=%zz" + secret, wantStatus: 400, wantCode: "INVALID_ARGUMENT"},
		{name: "get-not-acceptable", method: "GET", target: getQuery, accept: "text/event-stream", wantStatus: 406, wantCode: "INVALID_ARGUMENT"},
	}
	e := newEnv(t, HandlerOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := tt.target
			if target == "" {
				target = "/graphql"
			}
			a := e.send(t, tt.method, target, tt.contentType, tt.accept, tt.body)
			if a.status != tt.wantStatus {
				t.Errorf("got status %d, want %d (%s)", a.status, tt.wantStatus, a.body)
			}
			wantType := tt.wantType
			if wantType == "" {
				wantType = jsonT
			}
			if got := a.header.Get("Content-Type"); got != wantType+"; charset=utf-8" {
				t.Errorf("got Content-Type %q, want %q", got, wantType+"; charset=utf-8")
			}
			if _, got := a.fields["data"]; got != tt.wantData {
				t.Errorf("got a data entry %v, want %v (%s)", got, tt.wantData, a.body)
			}
			switch {
			case tt.wantCode == "" && len(a.errors) > 0:
				t.Errorf("got errors %s, want none", a.fields["errors"])
			case tt.wantCode != "" && len(a.errors) == 0:
				t.Errorf("got no errors, want %s (%s)", tt.wantCode, a.body)
			case tt.wantCode != "":
				if got, _ := a.errors[0].Extensions["code"].(string); got != tt.wantCode {
					t.Errorf("got code %q, want %q (%s)", got, tt.wantCode, a.body)
				}
			}
			for i, err := range a.errors {
				if c, _ := err.Extensions["code"].(string); c == "" {
					t.Errorf("error %d %q has no extensions.code", i, err.Message)
				}
			}
			if strings.Contains(a.body, secret) {
				t.Errorf("the answer echoes the request's input: %s", a.body)
			}
			if got := a.header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("got Allow %q, want %q", got, tt.wantAllow)
			}
		})
	}
	if calls := e.fake.Called(); contains(calls, "Stop") {
		t.Errorf("got service calls %v, want no Stop (a mutation over GET never runs)", calls)
	}
}

func TestWithCodes(t *testing.T) {
	coded := &gqlerror.Error{Message: "a", Extensions: map[string]any{"code": "NOT_FOUND"}}
	bare := &gqlerror.Error{Message: "b", Extensions: map[string]any{"field": "x"}}
	in := gqlerror.List{coded, bare}
	out := withCodes(in, "INTERNAL")
	if got := out[0].Extensions["code"]; got != "NOT_FOUND" {
		t.Errorf("got code %v for the coded error, want NOT_FOUND kept", got)
	}
	if got := out[1].Extensions["code"]; got != "INTERNAL" {
		t.Errorf("got code %v for the uncoded error, want INTERNAL", got)
	}
	if got := out[1].Extensions["field"]; got != "x" {
		t.Errorf("got field %v, want x kept", got)
	}
	if _, ok := bare.Extensions["code"]; ok || in[1] != bare {
		t.Errorf("withCodes changed its input: %+v", in[1])
	}
	if same := withCodes(gqlerror.List{coded}, "INTERNAL"); same[0] != coded {
		t.Errorf("got %+v, want the list of coded errors unchanged", same)
	}
}
