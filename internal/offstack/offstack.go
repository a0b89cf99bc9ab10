// Package offstack runs short, deep work off a long-lived goroutine.
//
// A goroutine's stack grows to the deepest call it made and keeps that size until a garbage
// collection finds it mostly unused (then halves it, once per collection). A goroutine that
// sets something up through deep code (a Redis client, GraphQL's extensions, a resolver) and
// then waits for a long time, as each idle subscription's goroutines do, keeps that stack for
// nothing: 10,000 of them are hundreds of megabytes. Run does the deep part on a goroutine
// that ends with it, so the waiting goroutine stays at the size its waiting needs.
package offstack

// Run calls f on a goroutine of its own and returns what f returned. A panic in f is raised
// again in the caller's goroutine, where its recover (gqlgen's, net/http's) can see it.
func Run[T any](f func() T) T {
	type result struct {
		v        T
		panicked bool
		p        any
	}
	done := make(chan result, 1)
	go func() {
		r := result{panicked: true}
		defer func() {
			if r.panicked {
				r.p = recover()
			}
			done <- r
		}()
		r.v = f()
		r.panicked = false
	}()
	r := <-done
	if r.panicked {
		panic(r.p)
	}
	return r.v
}
