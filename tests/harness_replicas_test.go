package tests

import (
	"testing"
)

// replicas starts n sandboxd processes on one real redis-server and one state folder.
func replicas(t *testing.T, redisURL string, n int) []*Server {
	t.Helper()
	return replicasWith(t, serverOptions{RedisURL: redisURL}, n)
}

// replicasWith starts n sandboxd processes with opts (its RedisURL a real redis-server) on one
// new state folder.
func replicasWith(t *testing.T, opts serverOptions, n int) []*Server {
	t.Helper()
	opts.State = newStateDir(t)
	out := make([]*Server, n)
	for i := range out {
		out[i] = startServer(t, opts)
	}
	return out
}
