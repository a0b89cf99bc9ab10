package proto

// The environment of a claimed warm box. A box of a warm pool is booted before anyone asks for
// it, so its PID 1 starts with the profile's environment only; the control plane hands the
// environment of the create that claimed it to the init once, before the sandbox is handed out:
//
//	PUT /v1/env   EnvRequest → EnvResult
//
// From then on every exec starts from the init's own environment with Env laid over it (the
// exec's own entries over both). A later PUT replaces Env; the init's own environment is never
// changed, nor the environment of a process already running.
const (
	// EnvPath is the endpoint that sets the environment every exec starts from.
	EnvPath = "/v1/env"
	// MaxEnvEntries bounds EnvRequest.Env.
	MaxEnvEntries = 1024
	// MaxEnvBytes bounds the request's body.
	MaxEnvBytes = 1 << 20
)

// EnvRequest is the body of PUT /v1/env.
type EnvRequest struct {
	// Env entries are KEY=VALUE, KEY not empty; a later entry of a key wins.
	Env []string `json:"env"`
}

// EnvResult is the answer of PUT /v1/env.
type EnvResult struct {
	// Entries is how many entries the init keeps.
	Entries int `json:"entries"`
}
