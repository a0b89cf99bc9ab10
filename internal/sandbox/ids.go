package sandbox

import (
	"strings"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/apierror"
)

// Ids are sortable (a ULID) with a readable prefix: "sbx_" for sandboxes, "exec_" for execs
// (internal/execs), "run_" for agent runs (internal/agents).
const idPrefix = "sbx_"

// NewID returns a new id with the prefix.
func NewID(prefix string) string { return prefix + ulid.Make().String() }

// ValidID reports whether id is prefix followed by a ULID, so that junk never reaches Redis or
// the runtime.
func ValidID(id, prefix string) bool {
	if len(id) != len(prefix)+26 || !strings.HasPrefix(id, prefix) {
		return false
	}
	_, err := ulid.ParseStrict(id[len(prefix):])
	return err == nil
}

func notFound(id string) error {
	return apierror.New(apierror.NotFound, "sandbox %s not found", apierror.Truncate(id, 64))
}
