package redistest

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// KeyTrips counts the round trips a client sends to Redis that touch keys holding a tag (an
// argument that contains it): one per command sent alone, one per pipeline, and per command
// name the commands among them. Round trips that touch no such key (a new connection's
// greeting, other work of the same client) are not counted.
type KeyTrips struct {
	mu    sync.Mutex
	tag   string
	trips int
	cmds  map[string]int
}

// CountKeyTrips adds a KeyTrips to c that counts for tag from now on.
func CountKeyTrips(c *redis.Client, tag string) *KeyTrips {
	k := &KeyTrips{}
	k.Watch(tag)
	c.AddHook(k)
	return k
}

// Watch starts counting again from zero, for tag.
func (k *KeyTrips) Watch(tag string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tag, k.trips, k.cmds = tag, 0, map[string]int{}
}

// Trips is the round trips counted since Watch.
func (k *KeyTrips) Trips() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.trips
}

// Commands is how many commands named name (lower case, "hgetall") touched the tag since Watch.
func (k *KeyTrips) Commands(name string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cmds[name]
}

func (k *KeyTrips) count(cmds []redis.Cmder) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tag == "" {
		return
	}
	touched := false
	for _, cmd := range cmds {
		if Touches(cmd, k.tag) {
			touched = true
			k.cmds[cmd.Name()]++
		}
	}
	if touched {
		k.trips++
	}
}

// Touches reports whether a command touches keys holding tag: one of its arguments contains it.
func Touches(cmd redis.Cmder, tag string) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, tag) {
			return true
		}
	}
	return false
}

// DialHook implements redis.Hook.
func (k *KeyTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (k *KeyTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		k.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (k *KeyTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		k.count(cmds)
		return next(ctx, cmds)
	}
}
