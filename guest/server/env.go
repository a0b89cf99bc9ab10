package server

import (
	"net/http"
	"strings"

	"sandboxd/guest/proto"
)

// handleSetEnv serves PUT /v1/env (proto/env.go): the environment a claimed warm box's
// creator asked for, laid over the base environment of every exec started from now on.
func (s *Server) handleSetEnv(w http.ResponseWriter, r *http.Request) {
	var req proto.EnvRequest
	if perr := readJSON(r, &req, proto.MaxEnvBytes); perr != nil {
		writeError(w, perr)
		return
	}
	if len(req.Env) > proto.MaxEnvEntries {
		writeError(w, errorf(proto.ErrCodeInvalid, "at most %d environment entries, got %d", proto.MaxEnvEntries, len(req.Env)))
		return
	}
	for _, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			writeError(w, errorf(proto.ErrCodeInvalid, "env entry %q is not KEY=VALUE", truncate(kv, 64)))
			return
		}
	}
	env := mergeEnv(req.Env) // a later entry of a key wins, once
	s.mu.Lock()
	s.extraEnv = env
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, proto.EnvResult{Entries: len(env)})
}

// execBaseEnv is what an exec's environment starts from: the init's base environment with the
// one PUT /v1/env set over it.
func (s *Server) execBaseEnv() []string {
	s.mu.Lock()
	extra := s.extraEnv
	s.mu.Unlock()
	return mergeEnv(s.opts.BaseEnv, extra)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
