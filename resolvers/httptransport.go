package resolvers

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/apierror"
)

// httpPOST and httpGET serve GraphQL over plain HTTP as the GraphQL-over-HTTP spec
// (graphql.github.io/graphql-over-http) asks, in place of gqlgen's transport.POST and GET, which
// answer parse and validation errors with 422, keep "data": null on them, and echo a body they
// cannot decode.
//
// The response's media type follows Accept: application/json when the client sends none, */*,
// application/* or application/json; application/graphql-response+json when it prefers that
// (q-values, then order, decide); 406 when it accepts neither. Status codes:
//   - a request that is not a well-formed GraphQL-over-HTTP request (no query, a parameter of
//     the wrong JSON type, variables that are not a JSON object): 400 in either media type;
//   - a request error (parse, validation, variable coercion, complexity, an operation refused
//     before it ran): the response has no "data" entry; 200 with application/json, and with
//     application/graphql-response+json the status of its code (400 for GraphQL's own codes);
//   - an executed operation (data present, even null, field errors or not): 200;
//   - a mutation (or subscription) over GET: 405 with Allow: POST;
//   - POST without Content-Type: application/json (UTF-8): 415; any method other than GET,
//     POST, HEAD and OPTIONS: 405.
//
// Every error carries extensions.code and no error quotes the request's body or URL (a parse
// error names the token it stopped at).
type (
	httpPOST struct{}
	httpGET  struct{}
)

var (
	_ graphql.Transport = httpPOST{}
	_ graphql.Transport = httpGET{}
)

// mediaType is a response media type of the GraphQL-over-HTTP spec.
type mediaType int

const (
	mediaJSON            mediaType = iota // application/json, the legacy default
	mediaGraphQLResponse                  // application/graphql-response+json
)

var mediaTypeNames = [...]string{
	mediaJSON:            "application/json",
	mediaGraphQLResponse: "application/graphql-response+json",
}

func (m mediaType) contentType() string { return mediaTypeNames[m] + "; charset=utf-8" }

// Supports claims every plain-HTTP request that is not a GET, HEAD or OPTIONS (a WebSocket or SSE
// request was taken by its transport before): POSTs, and other methods, which it answers with
// 405 rather than leave them to gqlgen's uncoded "transport not supported".
func (httpPOST) Supports(r *http.Request) bool {
	return r.Header.Get("Upgrade") == "" &&
		r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
}

func (httpPOST) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	start := graphql.Now()
	mt, ok := negotiate(r.Header.Values("Accept"))
	if !ok {
		writeNotAcceptable(w)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST, OPTIONS")
		writeHTTPError(w, mt, http.StatusMethodNotAllowed,
			apierror.New(apierror.InvalidArgument, "send GraphQL requests with POST (or GET for queries)"))
		return
	}
	if e := checkContentType(r.Header.Get("Content-Type")); e != nil {
		writeHTTPError(w, mt, http.StatusUnsupportedMediaType, e)
		return
	}
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			writeHTTPError(w, mt, http.StatusBadRequest, apierror.New(apierror.InvalidArgument, "could not read the request body"))
			return
		}
	}
	params, e := decodePOST(body)
	if e != nil {
		writeHTTPError(w, mt, http.StatusBadRequest, e)
		return
	}
	serveHTTP(w, r, exec, mt, params, start, false)
}

// Supports claims every plain GET (a WebSocket upgrade was taken by its transport before).
func (httpGET) Supports(r *http.Request) bool {
	return r.Header.Get("Upgrade") == "" && r.Method == http.MethodGet
}

func (httpGET) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	start := graphql.Now()
	mt, ok := negotiate(r.Header.Values("Accept"))
	if !ok {
		writeNotAcceptable(w)
		return
	}
	values, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeHTTPError(w, mt, http.StatusBadRequest,
			apierror.New(apierror.InvalidArgument, "the URL's query string is not valid application/x-www-form-urlencoded"))
		return
	}
	params, e := decodeGET(values)
	if e != nil {
		writeHTTPError(w, mt, http.StatusBadRequest, e)
		return
	}
	serveHTTP(w, r, exec, mt, params, start, true)
}

// serveHTTP runs a well-formed request and writes its response. queriesOnly refuses any other
// operation with 405 before it runs (GET).
func serveHTTP(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor, mt mediaType,
	params *graphql.RawParams, start time.Time, queriesOnly bool) {
	ctx := r.Context()
	params.Headers = r.Header
	params.ReadTime = graphql.TraceTiming{Start: start, End: graphql.Now()}

	opCtx, errs := exec.CreateOperationContext(ctx, params)
	if errs != nil {
		resp := exec.DispatchError(graphql.WithOperationContext(ctx, opCtx), errs)
		writeResponse(w, mt, resp)
		return
	}
	if op := opCtx.Operation.Operation; queriesOnly && op != ast.Query {
		msg := "GET runs queries only: send mutations with POST"
		if op == ast.Subscription {
			msg = "GET runs queries only: subscribe over a WebSocket (graphql-transport-ws) or SSE (POST with Accept: text/event-stream)"
		}
		w.Header().Set("Allow", "POST")
		writeHTTPError(w, mt, http.StatusMethodNotAllowed, apierror.New(apierror.InvalidArgument, "%s", msg))
		return
	}
	responses, ctx := exec.DispatchOperation(ctx, opCtx)
	writeResponse(w, mt, responses(ctx))
}

// checkContentType accepts application/json in UTF-8 (the default when no charset is given).
func checkContentType(header string) *apierror.Error {
	mt, params, err := mime.ParseMediaType(header)
	if err != nil || mt != "application/json" {
		return apierror.New(apierror.InvalidArgument, "send the request body as Content-Type: application/json")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
		return apierror.New(apierror.InvalidArgument, "send the request body in UTF-8 (charset=utf-8)")
	}
	return nil
}

// decodePOST reads a JSON request body: an object with query (a string), and operationName (a
// string), variables and extensions (objects), each optional and null when absent. Other keys
// are ignored. The errors name the parameter and the JSON type it had, never its value.
func decodePOST(body []byte) (*graphql.RawParams, *apierror.Error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierror.New(apierror.InvalidArgument, `the request body is empty: send a JSON object with a "query"`)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		if !json.Valid(body) {
			return nil, apierror.New(apierror.InvalidArgument, "the request body is not valid JSON")
		}
		return nil, apierror.New(apierror.InvalidArgument, `the request body must be a JSON object with a "query", not %s`,
			jsonKind(body))
	}
	p := &graphql.RawParams{}
	if e := decodeString(fields, "query", &p.Query); e != nil {
		return nil, e
	}
	if p.Query == "" {
		return nil, apierror.New(apierror.InvalidArgument, `the request has no "query"`)
	}
	if e := decodeString(fields, "operationName", &p.OperationName); e != nil {
		return nil, e
	}
	if e := decodeObject(fields["variables"], "variables", &p.Variables); e != nil {
		return nil, e
	}
	if e := decodeObject(fields["extensions"], "extensions", &p.Extensions); e != nil {
		return nil, e
	}
	return p, nil
}

// decodeGET reads the parameters of a GET: query and operationName as they are, variables and
// extensions as JSON objects.
func decodeGET(values url.Values) (*graphql.RawParams, *apierror.Error) {
	p := &graphql.RawParams{Query: values.Get("query"), OperationName: values.Get("operationName")}
	if p.Query == "" {
		return nil, apierror.New(apierror.InvalidArgument, `the request has no "query" URL parameter`)
	}
	for _, name := range []string{"variables", "extensions"} {
		s := values.Get(name)
		if s == "" {
			continue
		}
		if !json.Valid([]byte(s)) {
			return nil, apierror.New(apierror.InvalidArgument, "the %q URL parameter is not valid JSON", name)
		}
		dst := &p.Variables
		if name == "extensions" {
			dst = &p.Extensions
		}
		if e := decodeObject(json.RawMessage(s), name, dst); e != nil {
			return nil, e
		}
	}
	return p, nil
}

// decodeString sets *dst to the string fields[name]; absent and null leave it "".
func decodeString(fields map[string]json.RawMessage, name string, dst *string) *apierror.Error {
	raw := fields[name]
	if isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return apierror.New(apierror.InvalidArgument, "%q must be a string, not %s", name, jsonKind(raw)).
			WithDetail("field", name)
	}
	return nil
}

// decodeObject sets *dst to the JSON object raw, its numbers kept as json.Number (as gqlgen
// decodes them, for Int64 and exact floats); absent and null leave it nil.
func decodeObject(raw json.RawMessage, name string, dst *map[string]any) *apierror.Error {
	if isNull(raw) {
		return nil
	}
	if jsonKind(raw) != "an object" {
		return apierror.New(apierror.InvalidArgument, "%q must be a JSON object, not %s", name, jsonKind(raw)).
			WithDetail("field", name)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return apierror.New(apierror.InvalidArgument, "%q is not a valid JSON object", name).WithDetail("field", name)
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// jsonKind names the JSON type of a valid JSON value, with its article.
func jsonKind(raw []byte) string {
	s := bytes.TrimSpace(raw)
	if len(s) == 0 {
		return "nothing"
	}
	switch s[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// negotiate picks the response media type from the Accept header fields (RFC 9110 12.5.1):
// each type takes the q-value of the most specific range that matches it (*/* and application/*
// match both); the highest q wins, then the range listed first, then application/json. No
// Accept means application/json; ok is false when the client accepts neither type.
func negotiate(accept []string) (mt mediaType, ok bool) {
	header := strings.Join(accept, ",")
	if strings.TrimSpace(header) == "" {
		return mediaJSON, true
	}
	type match struct {
		q           float64
		specificity int // 0: no range matched; 1 */*; 2 application/*; 3 the type itself
		pos         int
	}
	var best [len(mediaTypeNames)]match
	pos := 0
	for part := range strings.SplitSeq(header, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		pos++
		name, params, err := mime.ParseMediaType(part)
		if err != nil {
			continue
		}
		q := 1.0
		if s, has := params["q"]; has {
			if q, err = strconv.ParseFloat(s, 64); err != nil || q < 0 || q > 1 {
				continue
			}
		}
		for i, candidate := range mediaTypeNames {
			specificity := 0
			switch name {
			case candidate:
				specificity = 3
			case "application/*":
				specificity = 2
			case "*/*":
				specificity = 1
			}
			if specificity > best[i].specificity {
				best[i] = match{q: q, specificity: specificity, pos: pos}
			}
		}
	}
	found := false
	for i, m := range best {
		if m.specificity == 0 || m.q <= 0 {
			continue
		}
		b := best[mt]
		if !found || m.q > b.q || (m.q == b.q && m.pos < b.pos) {
			mt, found = mediaType(i), true
		}
	}
	return mt, found
}

// wireResponse is graphql.Response as sent: without a "data" entry when there is none (a
// request error, which the spec says has none), with "data": null when execution made it null.
type wireResponse struct {
	Errors     gqlerror.List   `json:"errors,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	Label      string          `json:"label,omitempty"`
	Path       ast.Path        `json:"path,omitempty"`
	HasNext    *bool           `json:"hasNext,omitempty"`
	Extensions map[string]any  `json:"extensions,omitempty"`
}

// writeResponse writes a GraphQL response with its status: 200 when it has data (even null);
// without data it is a request error: 200 with application/json, the status of its first
// error's code with application/graphql-response+json.
func writeResponse(w http.ResponseWriter, mt mediaType, resp *graphql.Response) {
	if resp == nil { // only a subscription can end without a result, and those are refused here
		resp = &graphql.Response{Errors: gqlerror.List{gqlError(&apierror.Error{Code: apierror.Internal,
			Message: "internal error"})}}
	}
	status := http.StatusOK
	fallback := apierror.Internal
	if resp.Data == nil {
		fallback = apierror.InvalidArgument
		if len(resp.Errors) == 0 {
			resp.Data = json.RawMessage("null")
		} else if mt == mediaGraphQLResponse {
			status = requestErrorStatus(resp.Errors)
		}
	}
	resp.Errors = withCodes(resp.Errors, fallback)
	b, err := json.Marshal(wireResponse(*resp))
	if err != nil {
		writeHTTPError(w, mt, http.StatusInternalServerError, &apierror.Error{Code: apierror.Internal, Message: "internal error"})
		return
	}
	writeBody(w, mt, status, b)
}

// requestErrorStatus is the HTTP status of a request error: its first error's apierror code's,
// else 400 (GraphQL's own codes: parse, validation, complexity).
func requestErrorStatus(errs gqlerror.List) int {
	code, _ := errs[0].Extensions["code"].(string)
	if slices.Contains(apierror.Codes(), apierror.Code(code)) {
		if s := apierror.Code(code).HTTPStatus(); s >= 400 {
			return s
		}
	}
	return http.StatusBadRequest
}

// withCodes gives every error without an extensions.code the fallback code, on a copy.
func withCodes(errs gqlerror.List, fallback apierror.Code) gqlerror.List {
	var out gqlerror.List
	for i, e := range errs {
		if e == nil {
			continue
		}
		if c, _ := e.Extensions["code"].(string); c != "" {
			continue
		}
		if out == nil {
			out = slices.Clone(errs)
		}
		c := *e
		c.Extensions = make(map[string]any, len(e.Extensions)+1)
		for k, v := range e.Extensions {
			c.Extensions[k] = v
		}
		c.Extensions["code"] = string(fallback)
		out[i] = &c
	}
	if out == nil {
		return errs
	}
	return out
}

// writeHTTPError answers a request that GraphQL did not run: status, and a body with the one
// coded error and no "data" entry, in media type mt.
func writeHTTPError(w http.ResponseWriter, mt mediaType, status int, e *apierror.Error) {
	b, _ := json.Marshal(wireResponse{Errors: gqlerror.List{gqlError(e)}}) // plain values: it cannot fail
	writeBody(w, mt, status, b)
}

// writeNotAcceptable answers 406 (in application/json, the one type every client reads) to a
// request whose Accept names neither response media type.
func writeNotAcceptable(w http.ResponseWriter) {
	writeHTTPError(w, mediaJSON, http.StatusNotAcceptable, apierror.New(apierror.InvalidArgument,
		"the Accept header names no type this endpoint answers in: accept application/graphql-response+json or application/json"))
}

func writeBody(w http.ResponseWriter, mt mediaType, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", mt.contentType())
	h.Add("Vary", "Accept")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
