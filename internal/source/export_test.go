package source

import (
	"context"
	"net/netip"
)

// SetLookup replaces how f resolves host names.
func SetLookup(f *Fetcher, lookup func(ctx context.Context, host string) ([]netip.Addr, error)) {
	f.lookup = lookup
}

// Blocked says why an address is not public ("" when it is).
var Blocked = blocked
