package gvisor

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"sandboxd/internal/netpolicy"
	"sandboxd/runtime"
)

// The nftables layout of one driver (one state folder), in its own inet table so that servers
// on other state folders keep theirs:
//
//	input   (hook input):       from a box's interface → reject: a box never reaches the host.
//	forward (hook forward):     to a box's interface: replies only (established, related); no
//	                            new connection into a box, from the host's network or another box.
//	                            From a box's interface: jump boxes, where the box's own rule
//	                            sends it to its chain; a box interface without a chain: drop.
//	                            When sandboxd turned forwarding on, nothing else is forwarded.
//	postrouting (nat):          from a box's interface → masquerade.
//	boxes:                      iifname <box's interface> goto box-<tag>, one per box.
//	box-<tag>:                  replies accept; not IPv4 or not the box's own source → drop;
//	                            DNS to the policy's resolvers accept, any other port 53 reject;
//	                            the policy's rules in order (most specific first); reject.
//	deny:                       TCP reset, else ICMP administratively prohibited.
const (
	chainInput   = "input"
	chainForward = "forward"
	chainPost    = "postrouting"
	chainBoxes   = "boxes"
	chainDeny    = "deny"
)

// ifname is the 16-byte, NUL-padded form nftables compares an interface name with.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func metaIIF(prefix string, exact bool) []expr.Any {
	data := []byte(prefix)
	if exact {
		data = ifname(prefix)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

func metaOIF(prefix string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(prefix)},
	}
}

func ctReplies() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ipv4Addr matches the IPv4 source (offset 12) or destination (16) address against a prefix.
func ipv4Addr(offset uint32, p netip.Prefix) []expr.Any {
	net := p.Masked().Addr().As4()
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = make([]byte, 4)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

func l4Port(proto byte, port uint16) []expr.Any {
	p := make([]byte, 2)
	binary.BigEndian.PutUint16(p, port)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p},
	}
}

func verdict(k expr.VerdictKind) *expr.Verdict { return &expr.Verdict{Kind: k} }

func jumpTo(chain string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func gotoChain(chain string) *expr.Verdict {
	return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}
}

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// baseRuleset adds the table, its base chains and their rules to the batch of c. prefix is the
// interface name prefix of this driver's boxes.
func baseRuleset(c *nftables.Conn, table *nftables.Table, prefix string) {
	c.AddTable(table)
	accept := nftables.ChainPolicyAccept
	deny := c.AddChain(&nftables.Chain{Name: chainDeny, Table: table})
	c.AddRule(&nftables.Rule{Table: table, Chain: deny, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	c.AddRule(&nftables.Rule{Table: table, Chain: deny, Exprs: []expr.Any{
		&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
	}})
	boxes := c.AddChain(&nftables.Chain{Name: chainBoxes, Table: table})
	_ = boxes
	input := c.AddChain(&nftables.Chain{Name: chainInput, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: table, Chain: input, Exprs: join(metaIIF(prefix, false), []expr.Any{jumpTo(chainDeny)})})
	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: join(metaOIF(prefix, expr.CmpOpEq), ctReplies(), []expr.Any{verdict(expr.VerdictAccept)})})
	c.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: join(metaOIF(prefix, expr.CmpOpEq), []expr.Any{verdict(expr.VerdictDrop)})})
	c.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: join(metaIIF(prefix, false), []expr.Any{jumpTo(chainBoxes)})})
	c.AddRule(&nftables.Rule{Table: table, Chain: fwd, Exprs: join(metaIIF(prefix, false), []expr.Any{verdict(expr.VerdictDrop)})})
	post := c.AddChain(&nftables.Chain{Name: chainPost, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: table, Chain: post, Exprs: join(metaIIF(prefix, false), []expr.Any{&expr.Masq{}})})
}

// guardTable is the host-wide table that keeps the host from forwarding anything but boxes'
// traffic once sandboxd turned forwarding on (it was off): made with the sysctl and, like it,
// kept until the host restarts.
var guardTable = &nftables.Table{Name: "sandboxd-forward-guard", Family: nftables.TableFamilyINet}

// guardRuleset adds the guard table: forwarded traffic that neither comes from nor goes to a
// box's interface is dropped.
func guardRuleset(c *nftables.Conn) {
	c.AddTable(guardTable)
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: guardTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: guardTable, Chain: fwd, Exprs: join(
		[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(ifPrefixAll)}},
		metaOIF(ifPrefixAll, expr.CmpOpNeq), []expr.Any{verdict(expr.VerdictDrop)})})
}

func boxChainName(tag string) string { return "box-" + tag }

// boxRuleset adds one box's chain and its dispatch rule (tagged with the box id) to the batch.
func boxRuleset(c *nftables.Conn, table *nftables.Table, id, iface, tag string, boxIP netip.Addr, p *runtime.NetworkPolicy) {
	chain := c.AddChain(&nftables.Chain{Name: boxChainName(tag), Table: table})
	add := func(exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: join(exprs...)})
	}
	add(ctReplies(), []expr.Any{verdict(expr.VerdictAccept)})
	add([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		verdict(expr.VerdictDrop),
	})
	own := boxIP.As4()
	add([]expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: own[:]},
		verdict(expr.VerdictDrop),
	})
	for _, dns := range netpolicy.DNSAddrs(p) {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(ipv4Addr(16, netip.PrefixFrom(dns, 32)), l4Port(proto, 53), []expr.Any{verdict(expr.VerdictAccept)})
		}
	}
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		add(l4Port(proto, 53), []expr.Any{gotoChain(chainDeny)})
	}
	for _, r := range netpolicy.PolicyRules(p) {
		v := gotoChain(chainDeny)
		if r.Allow {
			v = verdict(expr.VerdictAccept)
		}
		add(ipv4Addr(16, r.Prefix), []expr.Any{v})
	}
	add([]expr.Any{gotoChain(chainDeny)})
	c.AddRule(&nftables.Rule{Table: table, Chain: &nftables.Chain{Name: chainBoxes, Table: table},
		Exprs: join(metaIIF(iface, true), []expr.Any{gotoChain(boxChainName(tag))}), UserData: []byte(id)})
}

// delBoxRuleset removes one box's dispatch rule and chain, whichever of them exist.
func delBoxRuleset(c *nftables.Conn, table *nftables.Table, id, tag string) error {
	rules, err := c.GetRules(table, &nftables.Chain{Name: chainBoxes, Table: table})
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	n := 0
	for _, r := range rules {
		if string(r.UserData) == id {
			if err := c.DelRule(r); err != nil {
				return err
			}
			n++
		}
	}
	chains, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == table.Name && ch.Name == boxChainName(tag) {
			c.DelChain(ch)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return c.Flush()
}
