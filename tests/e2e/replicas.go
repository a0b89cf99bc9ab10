package e2e

import (
	"testing"
)

// Replicas starts n sandboxd processes on one real redis-server and one state folder.
func Replicas(t *testing.T, redisURL string, n int) []*Server {
	t.Helper()
	return ReplicasWith(t, ServerOptions{RedisURL: redisURL}, n)
}

// ReplicasWith starts n sandboxd processes with opts (its RedisURL a real redis-server) on one
// new state folder.
func ReplicasWith(t *testing.T, opts ServerOptions, n int) []*Server {
	t.Helper()
	opts.State = NewStateDir(t)
	out := make([]*Server, n)
	for i := range out {
		out[i] = StartServer(t, opts)
	}
	return out
}
