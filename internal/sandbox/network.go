package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// NetworkConfig is the `network` section: what every egress policy shares.
type NetworkConfig struct {
	// DNSServers are the only resolvers a sandbox with egress may query, and the ones host
	// names of egress_allow are resolved with (IPv4 addresses; default: the host's
	// non-loopback nameservers).
	DNSServers []string `json:"dns_servers"`
	// AlwaysDeny are the ranges no egress policy reaches unless an allow entry inside them
	// opens them (nil: netpolicy.DefaultAlwaysDeny; the cluster's own ranges belong here).
	AlwaysDeny []string `json:"always_deny"`
}

// NetworkRequest narrows a profile's network policy at create; it can never widen it.
type NetworkRequest struct {
	// Mode is "none" or "egress" ("" keeps the profile's).
	Mode        string
	EgressAllow []string
	EgressDeny  []string
}

// NetworkPolicy is a sandbox's (or a profile's) effective network policy as reported.
type NetworkPolicy struct {
	// Mode is "none" (only loopback) or "egress".
	Mode string
	// EgressAllow are the allowed CIDRs and host names; EgressDeny the denied CIDRs.
	EgressAllow []string
	EgressDeny  []string
	// AlwaysDeny are the ranges closed unless an EgressAllow entry inside them opens them.
	AlwaysDeny []string
	// DNSServers are the only resolvers the sandbox may query.
	DNSServers []string
	// Pinned are the addresses each host name resolved to at create, the only ones it allows.
	Pinned []PinnedHost
}

// PinnedHost is a host name of egress_allow and the addresses it was pinned to.
type PinnedHost struct {
	Host      string
	Addresses []string
}

// Resolver resolves a host name of an egress allow list to its IPv4 addresses.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// NewResolver resolves through the given DNS servers only (the first that answers), never
// the host's own resolver configuration: a sandbox's names resolve as the sandbox's own
// queries will.
func NewResolver(servers []string) Resolver {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		if len(servers) == 0 {
			return nil, fmt.Errorf("no DNS server is configured (network.dns_servers)")
		}
		var lastErr error
		for _, srv := range servers {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, net.JoinHostPort(srv, "53"))
			}}
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			addrs, err := r.LookupNetIP(ctx, "ip4", host)
			cancel()
			if err == nil {
				return addrs, nil
			}
			lastErr = err
		}
		return nil, lastErr
	}
}

// checkNetwork parses the profiles' policies and the section's ranges (config validation).
func (c *Config) checkNetwork() error {
	if c.Network.AlwaysDeny == nil {
		c.Network.AlwaysDeny = slices.Clone(netpolicy.DefaultAlwaysDeny)
	}
	if err := netpolicy.CheckConfig(c.Network.AlwaysDeny, c.Network.DNSServers); err != nil {
		return fmt.Errorf("sandbox config: %v", err)
	}
	for i, p := range c.Profiles {
		spec, err := netpolicy.Parse(p.Network, p.EgressAllow, p.EgressDeny)
		if err != nil {
			return fmt.Errorf("sandbox config: profile %q: %v", p.Name, messageOf(err))
		}
		c.Profiles[i].Network, c.Profiles[i].EgressAllow, c.Profiles[i].EgressDeny = spec.Mode, spec.Allow, spec.Deny
	}
	return nil
}

func profileSpec(p ProfileConfig) netpolicy.Spec {
	return netpolicy.Spec{Mode: network(p.Network), Allow: p.EgressAllow, Deny: p.EgressDeny}
}

// networkFor returns a create's network mode and effective policy: the profile's, narrowed by
// the request, its host names resolved and pinned.
func (s *Service) networkFor(ctx context.Context, prof ProfileConfig, req *NetworkRequest) (string, *runtime.NetworkPolicy, error) {
	var narrow *netpolicy.Spec
	if req != nil {
		mode := req.Mode
		if mode == "" {
			mode = network(prof.Network)
		}
		spec, err := netpolicy.Parse(mode, req.EgressAllow, req.EgressDeny)
		if err != nil {
			return "", nil, err
		}
		narrow = &spec
	}
	spec, err := netpolicy.Narrow(prof.Name, profileSpec(prof), narrow, s.cfg.Network.AlwaysDeny)
	if err != nil {
		return "", nil, err
	}
	if spec.Mode != netpolicy.ModeEgress {
		return netpolicy.ModeNone, nil, nil
	}
	var pinned map[string][]string
	for _, h := range netpolicy.Hosts(spec.Allow) {
		addrs, err := s.resolve(ctx, h)
		if err != nil {
			return "", nil, apierror.Wrap(err, apierror.Unavailable, "could not resolve egress_allow host %q: %v", h, err)
		}
		if pinned == nil {
			pinned = map[string][]string{}
		}
		for _, a := range addrs {
			// An address the policy denies is left out: a name never opens what it closes.
			if a = a.Unmap(); a.Is4() && !denied(spec.Deny, a) && !denied(s.cfg.Network.AlwaysDeny, a) &&
				len(pinned[h]) < netpolicy.MaxPinned && !slices.Contains(pinned[h], a.String()) {
				pinned[h] = append(pinned[h], a.String())
			}
		}
		sort.Strings(pinned[h])
	}
	return netpolicy.ModeEgress, netpolicy.Effective(spec, s.cfg.Network.AlwaysDeny, s.cfg.Network.DNSServers, pinned), nil
}

// denied tells whether a CIDR of list holds a.
func denied(list []string, a netip.Addr) bool {
	return slices.ContainsFunc(list, func(e string) bool {
		p, err := netip.ParsePrefix(e)
		return err == nil && p.Contains(a)
	})
}

// policyOf reports a box's effective policy.
func policyOf(mode string, p *runtime.NetworkPolicy) NetworkPolicy {
	if p == nil || network(mode) != netpolicy.ModeEgress {
		return NetworkPolicy{Mode: netpolicy.ModeNone}
	}
	out := NetworkPolicy{Mode: netpolicy.ModeEgress, EgressAllow: slices.Clone(p.Allow), EgressDeny: slices.Clone(p.Deny),
		AlwaysDeny: slices.Clone(p.AlwaysDeny), DNSServers: slices.Clone(p.DNS)}
	for _, h := range netpolicy.Hosts(p.Allow) {
		out.Pinned = append(out.Pinned, PinnedHost{Host: h, Addresses: slices.Clone(p.Pinned[h])})
	}
	return out
}

// profilePolicy reports the policy a profile gives a create that does not narrow it (host
// names not yet resolved).
func (s *Service) profilePolicy(p ProfileConfig) NetworkPolicy {
	spec := profileSpec(p)
	return policyOf(spec.Mode, netpolicy.Effective(spec, s.cfg.Network.AlwaysDeny, s.cfg.Network.DNSServers, nil))
}

// messageOf is an error's public message (an apierror's without its code).
func messageOf(err error) string {
	if e, ok := err.(*apierror.Error); ok {
		return e.Message
	}
	return err.Error()
}
