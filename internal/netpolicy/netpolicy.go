// Package netpolicy is the network policy model both runtimes enforce: a profile's policy, a
// create's narrowing of it, the effective policy a box is built with (runtime.NetworkPolicy)
// and the ordered rules that decide a destination. It is pure: the local driver renders the
// rules as nftables rules, the Kubernetes driver as a NetworkPolicy.
//
// The decision rule is the routing table's: the most specific entry that holds an address
// decides (the longest prefix), and an address no entry holds is denied. At one prefix an
// egress_deny entry beats an egress_allow entry, which beats an always-denied range. So the
// always-denied ranges (metadata, link-local, loopback, private ranges) stay closed under an
// allow of 0.0.0.0/0, an allow inside one of them (10.1.2.3/32) opens just that, and listing
// one of them exactly (10.0.0.0/8) opens it.
package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"sandboxd/internal/apierror"
	"sandboxd/runtime"
)

// The modes.
const (
	// ModeNone: only the box's own loopback.
	ModeNone = "none"
	// ModeEgress: outbound connections the rules allow; nothing inbound.
	ModeEgress = "egress"
)

// DefaultAlwaysDeny are the ranges denied unless an allow entry inside them opens them: "this
// network", the private ranges (10/8, 172.16/12, 192.168/16, which is where a cluster's pods,
// services and nodes live), shared address space (100.64/10), loopback, link-local with the
// cloud metadata servers (169.254/16), IETF protocol assignments, multicast and the reserved
// range up to the broadcast address.
var DefaultAlwaysDeny = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
}

// Bounds of what a profile or a create may list.
const (
	// MaxEntries bounds egress_allow and egress_deny, each.
	MaxEntries = 64
	// MaxHostBytes is DNS's bound on a host name.
	MaxHostBytes = 253
	// MaxPinned bounds the addresses kept for one host name.
	MaxPinned = 16
)

// Spec is a policy as a profile states it or a create narrows it: entries as written (CIDRs,
// and host names in Allow), checked by Parse.
type Spec struct {
	Mode  string
	Allow []string
	Deny  []string
}

// Parse checks a policy's entries and returns them canonical: an address alone is its /32, a
// host name is lower case without a trailing dot, duplicates are dropped. Only IPv4 is
// supported: an IPv6 entry, a wildcard name or a CIDR with host bits set is refused with why.
func Parse(mode string, allow, deny []string) (Spec, error) {
	switch mode {
	case "", ModeNone:
		if len(allow) > 0 || len(deny) > 0 {
			return Spec{}, apierror.New(apierror.InvalidArgument, "network mode %q takes no egress_allow or egress_deny", ModeNone)
		}
		return Spec{Mode: ModeNone}, nil
	case ModeEgress:
	default:
		return Spec{}, apierror.New(apierror.InvalidArgument, "network mode %q: one of %q, %q", mode, ModeNone, ModeEgress)
	}
	if len(allow) > MaxEntries || len(deny) > MaxEntries {
		return Spec{}, apierror.New(apierror.InvalidArgument, "at most %d entries each in egress_allow and egress_deny", MaxEntries)
	}
	out := Spec{Mode: ModeEgress}
	for _, e := range allow {
		c, err := parseEntry("egress_allow", e, true)
		if err != nil {
			return Spec{}, err
		}
		out.Allow = appendNew(out.Allow, c)
	}
	for _, e := range deny {
		c, err := parseEntry("egress_deny", e, false)
		if err != nil {
			return Spec{}, err
		}
		out.Deny = appendNew(out.Deny, c)
	}
	return out, nil
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// parseEntry returns an entry canonical: a CIDR (an address alone is its /32), or with hosts
// a host name.
func parseEntry(field, e string, hosts bool) (string, error) {
	if e == "" || len(e) > MaxHostBytes+1 {
		return "", apierror.New(apierror.InvalidArgument, "%s: an entry must be 1 to %d bytes", field, MaxHostBytes)
	}
	if strings.ContainsAny(e, "/:") || isIPv4ish(e) {
		p, err := ParseCIDR(e)
		if err != nil {
			return "", apierror.New(apierror.InvalidArgument, "%s: %v", field, err)
		}
		return p.String(), nil
	}
	if !hosts {
		return "", apierror.New(apierror.InvalidArgument, "%s: %q is not an IPv4 CIDR (host names may only be allowed)", field, e)
	}
	h, err := ParseHost(e)
	if err != nil {
		return "", apierror.New(apierror.InvalidArgument, "%s: %v", field, err)
	}
	return h, nil
}

// isIPv4ish tells an entry that is meant as an address (digits and dots only).
func isIPv4ish(e string) bool {
	return strings.Trim(e, "0123456789.") == ""
}

// ParseCIDR parses an IPv4 CIDR or address (its /32). Host bits must be zero.
func ParseCIDR(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Errorf("%q is not a CIDR", s)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, fmt.Errorf("%q is not an address or a CIDR", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if !p.Addr().Is4() {
		return p, fmt.Errorf("%q: only IPv4 is supported (a box has no IPv6 route)", s)
	}
	if p.Masked() != p {
		return p, fmt.Errorf("%q has host bits set: did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// ParseHost checks a host name (RFC 1123 labels) and returns it lower case without a trailing
// dot. Wildcards are refused: a name is resolved and pinned, and a wildcard names no address.
func ParseHost(s string) (string, error) {
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if strings.HasPrefix(h, "*") {
		return "", fmt.Errorf("%q: wildcard names are not supported (names are resolved once and pinned)", s)
	}
	if h == "" || len(h) > MaxHostBytes || !strings.Contains(h, ".") {
		return "", fmt.Errorf("%q is not a fully qualified host name", s)
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("%q is not a valid host name", s)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("%q is not a valid host name", s)
			}
		}
	}
	return h, nil
}

// IsHost tells a canonical entry that is a host name from a CIDR.
func IsHost(e string) bool { return !strings.Contains(e, "/") }

// Hosts returns the host names among a policy's allow entries.
func Hosts(allow []string) []string {
	var out []string
	for _, e := range allow {
		if IsHost(e) {
			out = append(out, e)
		}
	}
	return out
}

// Narrow returns the policy a create gets from its profile's and its own request (nil: the
// profile's). A create may narrow, never widen: mode none always; egress only when the
// profile's is egress; each allow entry must be a host name the profile allows or a CIDR
// the profile allows whole (no address of it denied by the profile's rules or alwaysDeny);
// its deny entries are added to the profile's.
func Narrow(profileName string, profile Spec, req *Spec, alwaysDeny []string) (Spec, error) {
	if req == nil {
		return profile, nil
	}
	if req.Mode == ModeNone || req.Mode == "" {
		return Spec{Mode: ModeNone}, nil
	}
	if profile.Mode != ModeEgress {
		return Spec{}, apierror.New(apierror.PermissionDenied,
			"profile %q has network %q: a create may narrow its profile's network policy, never widen it", profileName, ModeNone)
	}
	out := Spec{Mode: ModeEgress, Allow: profile.Allow, Deny: slices.Clone(profile.Deny)}
	if len(req.Allow) > 0 {
		rules := Rules(profile.Allow, profile.Deny, alwaysDeny, nil)
		out.Allow = nil
		for _, e := range req.Allow {
			if IsHost(e) {
				if !slices.Contains(profile.Allow, e) {
					return Spec{}, apierror.New(apierror.PermissionDenied,
						"egress_allow: host %q is not in profile %q's egress_allow: a create may only narrow it", e, profileName)
				}
			} else if !AllowsWhole(rules, netip.MustParsePrefix(e)) {
				return Spec{}, apierror.New(apierror.PermissionDenied,
					"egress_allow: %s is not wholly allowed by profile %q: a create may only narrow its policy", e, profileName)
			}
			out.Allow = appendNew(out.Allow, e)
		}
	}
	for _, e := range req.Deny {
		out.Deny = appendNew(out.Deny, e)
	}
	if len(out.Deny) > 2*MaxEntries {
		return Spec{}, apierror.New(apierror.InvalidArgument, "at most %d egress_deny entries with the profile's", 2*MaxEntries)
	}
	return out, nil
}

// Rule is one entry of a policy's decision list.
type Rule struct {
	Prefix netip.Prefix
	Allow  bool
}

func (r Rule) String() string {
	if r.Allow {
		return "allow " + r.Prefix.String()
	}
	return "deny " + r.Prefix.String()
}

// Rules returns a policy's decision list, the most specific entry first: the first rule
// holding an address decides, and none holding it denies. At one length an egress_deny entry
// comes first, then an allow, then an always-denied range: an entry listed explicitly opens
// the always-denied range it names. Host names allow their pinned addresses, except those a
// deny entry or an always-denied range holds: a name's resolution never opens what the policy
// closes.
func Rules(allow, deny, alwaysDeny []string, pinned map[string][]string) []Rule {
	var rules []Rule
	// rank orders the rules of one length: an explicit deny 0, an allow 1, an always-denied
	// range 2. A prefix listed twice keeps its first (most binding) rank.
	rank := map[Rule]int{}
	add := func(r Rule, k int) {
		if _, ok := rank[r]; !ok {
			rank[r] = k
			rules = append(rules, r)
		}
	}
	var denies []netip.Prefix
	for k, list := range [][]string{deny, alwaysDeny} {
		for _, e := range list {
			if p, err := netip.ParsePrefix(e); err == nil {
				add(Rule{Prefix: p}, 2*k)
				denies = append(denies, p)
			}
		}
	}
	for _, e := range allow {
		if !IsHost(e) {
			if p, err := netip.ParsePrefix(e); err == nil {
				add(Rule{Prefix: p, Allow: true}, 1)
			}
			continue
		}
		for _, a := range pinned[e] {
			addr, err := netip.ParseAddr(a)
			if err != nil || !addr.Is4() || slices.ContainsFunc(denies, func(d netip.Prefix) bool { return d.Contains(addr) }) {
				continue
			}
			add(Rule{Prefix: netip.PrefixFrom(addr, 32), Allow: true}, 1)
		}
	}
	sort.SliceStable(rules, func(i, j int) bool {
		if a, b := rules[i].Prefix.Bits(), rules[j].Prefix.Bits(); a != b {
			return a > b
		}
		if a, b := rank[rules[i]], rank[rules[j]]; a != b {
			return a < b
		}
		return rules[i].Prefix.Addr().Less(rules[j].Prefix.Addr())
	})
	return rules
}

// Decide tells whether rules allow a destination address.
func Decide(rules []Rule, addr netip.Addr) bool {
	for _, r := range rules {
		if r.Prefix.Contains(addr) {
			return r.Allow
		}
	}
	return false
}

// AllowsWhole tells whether rules allow every address of p: the most specific rule holding
// all of p allows, and no deny rule inside p carves a hole.
func AllowsWhole(rules []Rule, p netip.Prefix) bool {
	covering := false
	for _, r := range rules {
		if r.Prefix.Bits() > p.Bits() {
			if !r.Allow && p.Contains(r.Prefix.Addr()) {
				return false
			}
			continue
		}
		if r.Prefix.Contains(p.Addr()) {
			covering = r.Allow
			break
		}
	}
	return covering
}

// Effective builds a box's policy from a narrowed spec, the configured always-denied ranges and
// resolvers, and the addresses its host names resolved to. Mode none is nil.
func Effective(spec Spec, alwaysDeny, dns []string, pinned map[string][]string) *runtime.NetworkPolicy {
	if spec.Mode != ModeEgress {
		return nil
	}
	return &runtime.NetworkPolicy{
		Mode: ModeEgress, Allow: slices.Clone(spec.Allow), Deny: slices.Clone(spec.Deny),
		AlwaysDeny: slices.Clone(alwaysDeny), DNS: slices.Clone(dns), Pinned: pinned,
	}
}

// PolicyRules is Rules of a box's effective policy (none for nil: everything denied).
func PolicyRules(p *runtime.NetworkPolicy) []Rule {
	if p == nil {
		return nil
	}
	return Rules(p.Allow, p.Deny, p.AlwaysDeny, p.Pinned)
}

// DNSAddrs returns a policy's resolvers as addresses.
func DNSAddrs(p *runtime.NetworkPolicy) []netip.Addr {
	if p == nil {
		return nil
	}
	var out []netip.Addr
	for _, s := range p.DNS {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

// CheckConfig checks the configured always-denied ranges and resolvers.
func CheckConfig(alwaysDeny, dns []string) error {
	for _, e := range alwaysDeny {
		if _, err := ParseCIDR(e); err != nil {
			return fmt.Errorf("network.always_deny: %v", err)
		}
	}
	for _, s := range dns {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return fmt.Errorf("network.dns_servers: %q is not an IPv4 address", s)
		}
	}
	return nil
}

// IPBlock is an allowed CIDR with the ranges inside it that stay denied: the shape of a
// Kubernetes NetworkPolicy's ipBlock.
type IPBlock struct {
	CIDR   string
	Except []string
}

// IPBlocks expresses rules as a union of allowed blocks: each allow rule (but one a deny of
// the same prefix earlier in the list overrides) with every deny rule strictly inside it as
// an exception. A more specific allow inside such an exception is a block of its own, so the
// union decides every address as Decide does.
func IPBlocks(rules []Rule) []IPBlock {
	var out []IPBlock
	for i, a := range rules {
		if !a.Allow || slices.Contains(rules[:i], Rule{Prefix: a.Prefix}) {
			continue
		}
		b := IPBlock{CIDR: a.Prefix.String()}
		for _, d := range rules {
			if !d.Allow && d.Prefix.Bits() > a.Prefix.Bits() && a.Prefix.Contains(d.Prefix.Addr()) {
				b.Except = append(b.Except, d.Prefix.String())
			}
		}
		out = append(out, b)
	}
	return out
}
