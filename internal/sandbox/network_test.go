package sandbox_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"sandboxd/internal/apierror"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
)

// TestCreateNetworkPolicy: a create gets its profile's policy, narrowed by its request, its
// host names resolved and pinned (addresses in denied ranges left out), recorded in the box's
// spec and reported; widening is PERMISSION_DENIED and costs no slot; a name that does not
// resolve fails the create with UNAVAILABLE.
func TestCreateNetworkPolicy(t *testing.T) {
	ctx := context.Background()
	resolved := map[string][]string{}
	e := domaintest.New(t, domaintest.Options{
		Limit: 2,
		Config: func(c *Config) {
			c.Profiles = append(c.Profiles, ProfileConfig{Name: "web", Network: "egress",
				EgressAllow: []string{"198.18.0.0/16", "api.example.com", "gone.example.com"}, EgressDeny: []string{"198.18.9.0/24"}})
			c.Network.DNSServers = []string{"198.18.0.53"}
		},
		Deps: func(d *domain.Deps) {
			d.Resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
				resolved[host] = append(resolved[host], "asked")
				switch host {
				case "api.example.com":
					return []netip.Addr{netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("169.254.169.254"),
						netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::1")}, nil
				}
				return nil, errors.New("no such host")
			}
		},
	})
	narrow := &NetworkRequest{Mode: "egress", EgressAllow: []string{"198.18.1.0/24", "api.example.com"}, EgressDeny: []string{"198.18.1.9"}}
	sb, err := e.Svc.Create(ctx, alice, CreateRequest{Profile: "web", Network: narrow})
	if err != nil {
		t.Fatal(err)
	}
	p := sb.NetworkPolicy
	if sb.Network != "egress" || p.Mode != "egress" || !slices.Equal(p.EgressAllow, []string{"198.18.1.0/24", "api.example.com"}) ||
		!slices.Equal(p.EgressDeny, []string{"198.18.9.0/24", "198.18.1.9/32"}) || !slices.Equal(p.DNSServers, []string{"198.18.0.53"}) ||
		len(p.Pinned) != 1 || !slices.Equal(p.Pinned[0].Addresses, []string{"203.0.113.7"}) ||
		!slices.Contains(p.AlwaysDeny, "169.254.0.0/16") {
		t.Fatalf("policy = %+v", p)
	}
	box, err := e.Fake.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if box.Record.Spec.Network != "egress" || box.Record.Spec.NetworkPolicy == nil ||
		!slices.Equal(box.Record.Spec.NetworkPolicy.Pinned["api.example.com"], []string{"203.0.113.7"}) {
		t.Fatalf("box spec = %+v", box.Record.Spec)
	}
	got, err := e.Svc.Get(ctx, alice, sb.ID)
	if err != nil || !slices.Equal(got.NetworkPolicy.EgressAllow, p.EgressAllow) {
		t.Fatalf("Get: %+v %v", got.NetworkPolicy, err)
	}
	// The default profile has no network; a create of it reports none.
	none, err := e.Svc.Create(ctx, alice, CreateRequest{})
	if err != nil || none.Network != "none" || none.NetworkPolicy.Mode != "none" {
		t.Fatalf("default profile: %+v %v", none.NetworkPolicy, err)
	}
	for _, c := range []struct {
		req  CreateRequest
		code apierror.Code
	}{
		{CreateRequest{Network: &NetworkRequest{Mode: "egress"}}, apierror.PermissionDenied},
		{CreateRequest{Profile: "web", Network: &NetworkRequest{Mode: "egress", EgressAllow: []string{"198.0.0.0/8"}}}, apierror.PermissionDenied},
		{CreateRequest{Profile: "web", Network: &NetworkRequest{Mode: "egress", EgressAllow: []string{"198.18.9.0/25"}}}, apierror.PermissionDenied},
		{CreateRequest{Profile: "web", Network: &NetworkRequest{Mode: "egress", EgressAllow: []string{"evil.example.com"}}}, apierror.PermissionDenied},
		{CreateRequest{Profile: "web", Network: &NetworkRequest{Mode: "egress", EgressAllow: []string{"gone.example.com"}}}, apierror.Unavailable},
		{CreateRequest{Profile: "web", Network: &NetworkRequest{Mode: "bridge"}}, apierror.InvalidArgument},
	} {
		if _, err := e.Svc.Create(ctx, alice, c.req); apierror.CodeOf(err) != c.code {
			t.Errorf("Create(%+v) = %v, want %s", *c.req.Network, err, c.code)
		}
	}
	// The refusals took no slot: the limit is 2 and two sandboxes exist.
	if u, err := e.Svc.Quota(ctx, alice); err != nil || u.InUse != 2 {
		t.Fatalf("quota after refusals: %+v %v", u, err)
	}
	profiles := e.Svc.Profiles()
	i := slices.IndexFunc(profiles, func(p Profile) bool { return p.Name == "web" })
	if i < 0 || profiles[i].NetworkPolicy.Mode != "egress" || len(profiles[i].NetworkPolicy.Pinned) != 2 {
		t.Fatalf("profile web: %+v", profiles)
	}
}
