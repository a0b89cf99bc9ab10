package proto

// The release of ended execs. Once the control plane holds an exec's whole output and exit
// status (its stream in Redis ends with the exit), the guest init's log of it is a copy nobody
// reads: files of the init's state folder, a tmpfs, so the box's memory, and state every pause
// saves. The control plane gives such execs back in batches:
//
//	POST /v1/release   ReleaseRequest → ReleaseResult
//
// The init forgets each named exec that ended and left nothing running (its command never
// started, or its cgroup is empty and given back), as DELETE /v1/execs/{id} does. Every other
// id is skipped without an error: one unknown here, one still running, one whose command left
// processes behind (they stay the exec's, for a kill or a forget), and every started exec of
// an init that tracks processes without cgroups. An init older than this endpoint answers not
// found: its execs are kept as before, within its own bounds.
const (
	// ReleasePath is the endpoint of a release.
	ReleasePath = "/v1/release"
	// MaxReleaseIDs bounds ReleaseRequest.IDs.
	MaxReleaseIDs = 1000
	// MaxReleaseBytes bounds the request's body.
	MaxReleaseBytes = 128 << 10
)

// ReleaseRequest is the body of POST /v1/release.
type ReleaseRequest struct {
	IDs []string `json:"ids"`
}

// ReleaseResult is the answer of POST /v1/release.
type ReleaseResult struct {
	// Released is how many of the ids were forgotten.
	Released int `json:"released"`
}
