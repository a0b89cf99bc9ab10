package netpolicy

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"sandboxd/internal/apierror"
)

func TestParse(t *testing.T) {
	got, err := Parse("egress", []string{"198.18.1.0/24", "198.18.2.7", "PyPI.org.", "pypi.org"}, []string{"198.18.1.128/25"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"198.18.1.0/24", "198.18.2.7/32", "pypi.org"}; !slices.Equal(got.Allow, want) {
		t.Fatalf("allow = %v, want %v", got.Allow, want)
	}
	if none, err := Parse("", nil, nil); err != nil || none.Mode != ModeNone {
		t.Fatalf("empty mode: %+v %v", none, err)
	}
	bad := []struct {
		mode        string
		allow, deny []string
		code        apierror.Code
	}{
		{"open", nil, nil, apierror.InvalidArgument},
		{"none", []string{"1.1.1.1"}, nil, apierror.InvalidArgument},
		{"egress", []string{"2001:db8::/32"}, nil, apierror.InvalidArgument},
		{"egress", []string{"198.18.1.5/24"}, nil, apierror.InvalidArgument},
		{"egress", []string{"*.example.com"}, nil, apierror.InvalidArgument},
		{"egress", []string{"localhost"}, nil, apierror.InvalidArgument},
		{"egress", []string{"bad_name.example.com"}, nil, apierror.InvalidArgument},
		{"egress", []string{"-a.example.com"}, nil, apierror.InvalidArgument},
		{"egress", []string{"1.2.3"}, nil, apierror.InvalidArgument},
		{"egress", []string{""}, nil, apierror.InvalidArgument},
		{"egress", nil, []string{"example.com"}, apierror.InvalidArgument},
		{"egress", make([]string, MaxEntries+1), nil, apierror.InvalidArgument},
	}
	for _, c := range bad {
		if _, err := Parse(c.mode, c.allow, c.deny); apierror.CodeOf(err) != c.code {
			t.Errorf("Parse(%q, %q, %q) = %v, want %s", c.mode, c.allow, c.deny, err, c.code)
		}
	}
}

func decide(t *testing.T, rules []Rule, addr string) bool {
	t.Helper()
	return Decide(rules, netip.MustParseAddr(addr))
}

func TestRulesMostSpecificWins(t *testing.T) {
	rules := Rules([]string{"0.0.0.0/0", "10.1.2.3/32", "198.18.1.0/24", "api.example.com"},
		[]string{"198.18.1.128/25", "8.8.0.0/16"}, DefaultAlwaysDeny,
		map[string][]string{"api.example.com": {"8.8.8.8", "203.0.113.9", "169.254.169.254"}})
	for addr, want := range map[string]bool{
		"1.1.1.1":         true,  // 0/0
		"169.254.169.254": false, // metadata stays closed under 0/0
		"169.254.77.77":   false,
		"127.0.0.1":       false,
		"10.9.9.9":        false, // private range
		"10.1.2.3":        true,  // opened explicitly
		"192.168.1.1":     false,
		"198.18.1.5":      true,
		"198.18.1.200":    false, // the deny inside the allow
		"8.8.8.8":         false, // a name's address never opens a deny
		"203.0.113.9":     true,
	} {
		if got := decide(t, rules, addr); got != want {
			t.Errorf("%s: allowed = %v, want %v (rules %v)", addr, got, want, rules)
		}
	}
	// A tie: deny wins.
	if decide(t, Rules([]string{"198.18.0.0/16"}, []string{"198.18.0.0/16"}, nil, nil), "198.18.0.1") {
		t.Error("an allow and a deny of one prefix: allowed")
	}
	// An always-denied range listed exactly is opened ("unless explicitly listed"), also in
	// the NetworkPolicy's blocks; an egress_deny of it still closes it; 0/0 does not open it.
	listed := Rules([]string{"0.0.0.0/0", "10.0.0.0/8", "169.254.0.0/16"}, nil, DefaultAlwaysDeny, nil)
	for addr, want := range map[string]bool{"10.9.9.9": true, "169.254.169.254": true, "192.168.1.1": false, "1.1.1.1": true} {
		if got := decide(t, listed, addr); got != want {
			t.Errorf("explicitly listed ranges: %s allowed = %v, want %v (rules %v)", addr, got, want, listed)
		}
	}
	if !slices.ContainsFunc(IPBlocks(listed), func(b IPBlock) bool { return b.CIDR == "10.0.0.0/8" && len(b.Except) == 0 }) {
		t.Errorf("explicitly listed 10.0.0.0/8: no block of its own in %+v", IPBlocks(listed))
	}
	if decide(t, Rules([]string{"10.0.0.0/8"}, []string{"10.0.0.0/8"}, DefaultAlwaysDeny, nil), "10.9.9.9") {
		t.Error("10.0.0.0/8 both allowed and denied: allowed")
	}
	if decide(t, Rules([]string{"pinned.example"}, nil, DefaultAlwaysDeny, map[string][]string{"pinned.example": {"10.9.9.9"}}), "10.9.9.9") {
		t.Error("a host name resolving into an always-denied range opened it")
	}
	// Nothing listed: denied.
	if decide(t, Rules(nil, nil, DefaultAlwaysDeny, nil), "1.1.1.1") {
		t.Error("no allow entry: allowed")
	}
}

func TestNarrow(t *testing.T) {
	prof, err := Parse("egress", []string{"0.0.0.0/0", "pypi.org"}, []string{"198.18.9.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	ok := []Spec{
		{Mode: ModeNone},
		{Mode: ModeEgress, Allow: []string{"198.18.1.0/24"}},
		{Mode: ModeEgress, Allow: []string{"pypi.org"}, Deny: []string{"203.0.113.0/24"}},
	}
	for _, req := range ok {
		got, err := Narrow("p", prof, &req, DefaultAlwaysDeny)
		if err != nil {
			t.Errorf("Narrow(%+v): %v", req, err)
			continue
		}
		if !slices.Contains(got.Deny, "198.18.9.0/24") && got.Mode == ModeEgress {
			t.Errorf("Narrow(%+v) lost the profile's deny: %+v", req, got)
		}
	}
	widen := []Spec{
		{Mode: ModeEgress, Allow: []string{"198.18.0.0/16"}},      // holds the profile's deny
		{Mode: ModeEgress, Allow: []string{"169.254.169.254/32"}}, // always denied
		{Mode: ModeEgress, Allow: []string{"10.0.0.0/8"}},
		{Mode: ModeEgress, Allow: []string{"example.com"}}, // a name the profile does not list
	}
	for _, req := range widen {
		if _, err := Narrow("p", prof, &req, DefaultAlwaysDeny); apierror.CodeOf(err) != apierror.PermissionDenied {
			t.Errorf("Narrow(%+v) = %v, want PERMISSION_DENIED", req, err)
		}
	}
	none := Spec{Mode: ModeNone}
	if _, err := Narrow("p", none, &Spec{Mode: ModeEgress}, DefaultAlwaysDeny); apierror.CodeOf(err) != apierror.PermissionDenied {
		t.Errorf("egress on a none profile: %v", err)
	}
	if got, _ := Narrow("p", prof, nil, DefaultAlwaysDeny); !slices.Equal(got.Allow, prof.Allow) {
		t.Errorf("no request: %+v", got)
	}
}

// TestNarrowNeverWidens: any narrowing Narrow accepts allows no address its profile denies.
func TestNarrowNeverWidens(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	prefix := func() string {
		bits := 8 + r.IntN(25)
		a := netip.AddrFrom4([4]byte{198, byte(16 + r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(8))})
		return netip.PrefixFrom(a, bits).Masked().String()
	}
	for range 2000 {
		prof := Spec{Mode: ModeEgress, Allow: []string{prefix(), prefix()}, Deny: []string{prefix()}}
		req := Spec{Mode: ModeEgress, Allow: []string{prefix()}}
		got, err := Narrow("p", prof, &req, DefaultAlwaysDeny)
		if err != nil {
			continue
		}
		pr := Rules(prof.Allow, prof.Deny, DefaultAlwaysDeny, nil)
		gr := Rules(got.Allow, got.Deny, DefaultAlwaysDeny, nil)
		for range 200 {
			a := netip.AddrFrom4([4]byte{198, byte(16 + r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
			if Decide(gr, a) && !Decide(pr, a) {
				t.Fatalf("profile %+v narrowed by %+v allows %s", prof, req, a)
			}
		}
	}
}

// TestIPBlocksDecideAlike: the union of IPBlocks allows exactly what Decide allows.
func TestIPBlocksDecideAlike(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	prefix := func() string {
		bits := 8 + r.IntN(25)
		a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(8))})
		return netip.PrefixFrom(a, bits).Masked().String()
	}
	for range 500 {
		rules := Rules([]string{prefix(), prefix(), prefix(), "0.0.0.0/0"}, []string{prefix(), prefix()}, DefaultAlwaysDeny, nil)
		blocks := IPBlocks(rules)
		for range 300 {
			a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
			if r.IntN(4) == 0 {
				a = netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(256)), 0, 1})
			}
			in := false
			for _, b := range blocks {
				p := netip.MustParsePrefix(b.CIDR)
				if p.Contains(a) && !slices.ContainsFunc(b.Except, func(e string) bool { return netip.MustParsePrefix(e).Contains(a) }) {
					in = true
				}
				for _, e := range b.Except {
					if ep := netip.MustParsePrefix(e); ep.Bits() <= p.Bits() || !p.Contains(ep.Addr()) {
						t.Fatalf("block %s: except %s is not strictly inside", b.CIDR, e)
					}
				}
			}
			if in != Decide(rules, a) {
				t.Fatalf("%s: blocks say %v, rules %v say %v (blocks %+v)", a, in, rules, !in, blocks)
			}
		}
	}
}
