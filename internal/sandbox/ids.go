package sandbox

import (
	"strings"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/apierror"
)

const idPrefix = "sbx_"

func newID(prefix string) string { return prefix + ulid.Make().String() }

// validID reports whether id has the shape of a sandbox id, so that junk never reaches Redis or
// the runtime.
func validID(id string) bool { return validPrefixedID(id, idPrefix) }

// validPrefixedID reports whether id is prefix followed by a ULID (sandbox and exec ids).
func validPrefixedID(id, prefix string) bool {
	if len(id) != len(prefix)+26 || !strings.HasPrefix(id, prefix) {
		return false
	}
	_, err := ulid.ParseStrict(id[len(prefix):])
	return err == nil
}

func notFound(id string) error {
	return apierror.New(apierror.NotFound, "sandbox %s not found", apierror.Truncate(id, 64))
}
