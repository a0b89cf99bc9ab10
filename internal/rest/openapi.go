package rest

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"sandboxd/internal/apierror"
)

// The OpenAPI 3.1 document of the REST API: every route of New, its parameters, bodies and
// answers, the error body with its codes, and the schema of each Server-Sent Event
// (x-sse-events). It is written in YAML beside the handlers it describes and served as JSON
// at GET /openapi.json. Tests keep it honest: TestOpenAPIRoutes compares its paths with the
// route table, and the end-to-end tests validate every REST request and answer they make
// against the document the server serves.
//
//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPIPath is where the server serves the document.
const OpenAPIPath = "/openapi.json"

// openapiJSON is the document as JSON (its members in sorted order) and its ETag.
var openapiJSON = sync.OnceValues(func() (doc []byte, err error) {
	return yaml.YAMLToJSON(openapiYAML)
})

// OpenAPIDocument answers the OpenAPI document as JSON.
func OpenAPIDocument() ([]byte, error) { return openapiJSON() }

// OpenAPIHandler serves the OpenAPI document (mount it at GET /openapi.json). It needs no
// key: the document holds no secrets, only what the README says, and code generators and
// documentation viewers fetch it without one. It answers with an ETag (its sha256), so that
// a client revalidates it cheaply (304), and to HEAD.
func OpenAPIHandler(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		doc, err := OpenAPIDocument()
		if err != nil {
			WriteError(w, log, r, apierror.Wrap(err, apierror.Internal, "internal error"))
			return
		}
		sum := sha256.Sum256(doc)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:16])+`"`)
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, "openapi.json", time.Time{}, bytes.NewReader(doc))
	})
}
