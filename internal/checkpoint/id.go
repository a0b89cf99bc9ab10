package checkpoint

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"sandboxd/internal/apierror"
)

const (
	sandboxIDPrefix  = "sbx_"
	snapshotIDPrefix = "snap_"
	ulidLen          = 26
	seqDigits        = 10
	maxSeq           = 9_999_999_999 // the largest n with seqDigits digits
)

// ParseID splits a snapshot id, "snap_" + the sandbox id's ULID + "_" + n in ten digits (e.g.
// snap_01JXYZ…_0000000003), into the sandbox id ("sbx_01JXYZ…") and n (at least 1). A malformed
// id is an error wrapping ErrInvalidID.
func ParseID(id string) (sandboxID string, n int64, err error) {
	rest, ok := strings.CutPrefix(id, snapshotIDPrefix)
	if !ok || len(rest) != ulidLen+1+seqDigits || rest[ulidLen] != '_' || !isULID(rest[:ulidLen]) {
		return "", 0, invalidID(id)
	}
	digits := rest[ulidLen+1:]
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return "", 0, invalidID(id)
		}
	}
	n, err = strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 1 {
		return "", 0, invalidID(id)
	}
	return sandboxIDPrefix + rest[:ulidLen], n, nil
}

func invalidID(id string) error {
	if len(id) > 80 {
		id = id[:80] + "…"
	}
	return fmt.Errorf("%w %q: want snap_<ULID>_<10 digits>", ErrInvalidID, id)
}

// formatID is the snapshot id of checkpoint n of a (valid) sandbox id.
func formatID(sandboxID string, n int64) string {
	return fmt.Sprintf("%s%s_%0*d", snapshotIDPrefix, strings.TrimPrefix(sandboxID, sandboxIDPrefix), seqDigits, n)
}

// isULID reports whether s is a ULID in canonical form (26 upper-case Crockford base32 chars).
func isULID(s string) bool {
	u, err := ulid.ParseStrict(s)
	return err == nil && u.String() == s
}

// isSandboxID reports whether s is "sbx_" + a canonical ULID.
func isSandboxID(s string) bool {
	rest, ok := strings.CutPrefix(s, sandboxIDPrefix)
	return ok && isULID(rest)
}

// Scope names the sandbox that checkpoints belong to.
type Scope struct {
	Tenant  string
	Project string
	// Sandbox is the sandbox id: "sbx_" + a ULID.
	Sandbox string
}

func (s Scope) check() error {
	if !isSegment(s.Tenant) || !isSegment(s.Project) || !isSandboxID(s.Sandbox) {
		return fmt.Errorf("%w: tenant %q, project %q, sandbox %q", ErrInvalidScope, s.Tenant, s.Project, s.Sandbox)
	}
	return nil
}

// isSegment reports whether s may be one segment of an object key: not empty, at most 256
// bytes of UTF-8, no "/", no control characters, not starting with ".".
func isSegment(s string) bool {
	if s == "" || len(s) > 256 || s[0] == '.' || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == '/' || r == '\\' || r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// The package's errors; match them with errors.Is. ErrNotFound, ErrInvalidID and
// ErrInvalidScope carry an apierror code (do not modify them).
var (
	// ErrNotFound means that the scope has no complete checkpoint with that id.
	ErrNotFound = apierror.New(apierror.NotFound, "snapshot not found")
	// ErrInvalidID means that a snapshot id is malformed.
	ErrInvalidID = apierror.New(apierror.InvalidArgument, "invalid snapshot id")
	// ErrInvalidScope means that a tenant, project or sandbox id cannot name checkpoints.
	ErrInvalidScope = apierror.New(apierror.InvalidArgument, "invalid checkpoint scope")
)
