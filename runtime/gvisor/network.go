package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sandboxd/runtime"
)

// A box with egress (spec.Network "egress") runs on runsc's own network stack
// (--network=sandbox) in a network namespace of its own, made here: a veth pair whose host end
// is named <prefix><tag> (prefix: "sb" + a tag of the state folder; tag: of the box id) and
// whose other end is the namespace's eth0, a /30 of the local subnet for the two ends, the
// host end as the default route. The box's policy is enforced on the host side, in the
// driver's nftables table (nftrules.go), where nothing in the box can change it. The namespace
// is pinned by a bind mount under StateDir/net/ns. Everything is undone when the box's container
// ends (destroyContainer) and, for what a killed server left, when the driver starts.

const (
	// ifPrefixAll starts the host interface of every box of every driver.
	ifPrefixAll = "sb"
	// DefaultLocalSubnet is where boxes with egress get their /30 from.
	DefaultLocalSubnet = "10.213.0.0/16"
	// netSlotsDir is the host-wide folder of /30 allocations (tmpfs: a reboot frees them with
	// the interfaces), shared by every driver on the host.
	netSlotsDir = "/run/sandboxd/net-slots"
	// forwardMarker says that sandboxd turned IPv4 forwarding on (it was off), so the host
	// forwards nothing but boxes' traffic.
	forwardMarker = "/run/sandboxd/ip_forward-enabled"
)

// setupGrace is how long a box's network may exist before its container runs (a create's
// setup takes at most cliTimeout and the ready wait).
const setupGrace = 2 * time.Minute

// netState sets up and tears down the network of the driver's boxes with egress.
type netState struct {
	dir    string // StateDir/net
	subnet netip.Prefix
	prefix string // interface name prefix of this driver's boxes
	table  *nftables.Table
	log    *slog.Logger

	mu        sync.Mutex // nftables and forwarding changes within the process (and nftLock across)
	tableDone bool
}

func newNetState(stateDir, subnet string, log *slog.Logger) (*netState, error) {
	if subnet == "" {
		subnet = DefaultLocalSubnet
	}
	p, err := netip.ParsePrefix(subnet)
	if err != nil || !p.Addr().Is4() || p.Masked() != p || p.Bits() > 28 || p.Bits() < 8 {
		return nil, fmt.Errorf("gvisor: local subnet %q must be an IPv4 CIDR from /8 to /28 without host bits", subnet)
	}
	sum := sha256.Sum256([]byte(stateDir))
	tag := hex.EncodeToString(sum[:])[:5]
	n := &netState{dir: filepath.Join(stateDir, "net"), subnet: p, prefix: ifPrefixAll + tag, log: log,
		table: &nftables.Table{Name: "sandboxd-" + tag, Family: nftables.TableFamilyINet}}
	for _, d := range []string{n.dir, filepath.Join(n.dir, "ns"), filepath.Join(n.dir, "boxes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	return n, nil
}

// boxTag names a box's interface and chain: 8 hex digits of its id's hash.
func boxTag(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:4])
}

func (n *netState) iface(id string) string  { return n.prefix + boxTag(id) }
func (n *netState) nsPath(id string) string { return filepath.Join(n.dir, "ns", id) }
func (n *netState) boxFile(id string) string {
	return filepath.Join(n.dir, "boxes", id)
}
func (n *netState) slotDir() string {
	return filepath.Join(netSlotsDir, strings.NewReplacer(".", "_", "/", "_").Replace(n.subnet.String()))
}

// slotAddrs are the host's and the box's addresses of /30 number i.
func (n *netState) slotAddrs(i uint32) (host, box netip.Addr) {
	base := binary.BigEndian.Uint32(n.subnet.Addr().AsSlice()) + i*4
	var h, b [4]byte
	binary.BigEndian.PutUint32(h[:], base+1)
	binary.BigEndian.PutUint32(b[:], base+2)
	return netip.AddrFrom4(h), netip.AddrFrom4(b)
}

// allocSlot takes a free /30 for the box, host-wide: a file per slot made with O_EXCL.
func (n *netState) allocSlot(id string) (uint32, error) {
	if err := os.MkdirAll(n.slotDir(), 0o700); err != nil {
		return 0, fmt.Errorf("gvisor: network slots: %w", err)
	}
	slots := uint32(1) << (32 - n.subnet.Bits() - 2)
	sum := sha256.Sum256([]byte(id))
	first := binary.BigEndian.Uint32(sum[4:8]) % slots
	owner := n.dir + " " + id
	for k := range slots {
		i := (first + k) % slots
		f, err := os.OpenFile(filepath.Join(n.slotDir(), strconv.FormatUint(uint64(i), 10)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("gvisor: network slot: %w", err)
		}
		_, err = f.WriteString(owner)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, fmt.Errorf("gvisor: network slot: %w", err)
		}
		if err := os.WriteFile(n.boxFile(id), []byte(strconv.FormatUint(uint64(i), 10)), 0o600); err != nil {
			_ = os.Remove(filepath.Join(n.slotDir(), strconv.FormatUint(uint64(i), 10)))
			return 0, fmt.Errorf("gvisor: network slot: %w", err)
		}
		return i, nil
	}
	return 0, fmt.Errorf("gvisor: no free address in the local subnet %s for another box with egress", n.subnet)
}

// lockNft takes the driver's nftables lock (a flock shared with other servers on the state
// folder) besides the process's mutex.
func (n *netState) lockNft() (func(), error) {
	n.mu.Lock()
	f, err := os.OpenFile(filepath.Join(n.dir, "nft.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		n.mu.Unlock()
		return nil, fmt.Errorf("gvisor: nftables lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		n.mu.Unlock()
		return nil, fmt.Errorf("gvisor: nftables lock: %w", err)
	}
	return func() { f.Close(); n.mu.Unlock() }, nil
}

// ensureTable makes the driver's table when it is missing, and turns IPv4 forwarding on (the
// host then forwards nothing but boxes' traffic, when it forwarded nothing before). Under
// lockNft.
func (n *netState) ensureTable(c *nftables.Conn) error {
	if n.tableDone {
		if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err == nil {
			return nil
		}
	}
	guard, err := enableForwarding()
	if err != nil {
		return err
	}
	if guard {
		if _, err := c.ListTableOfFamily(guardTable.Name, guardTable.Family); err != nil {
			guardRuleset(c)
			if err := c.Flush(); err != nil {
				return fmt.Errorf("gvisor: nftables table %s: %w", guardTable.Name, err)
			}
		}
	}
	if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err == nil {
		n.tableDone = true
		return nil
	}
	baseRuleset(c, n.table, n.prefix)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("gvisor: nftables table %s: %w", n.table.Name, err)
	}
	n.tableDone = true
	return nil
}

// enableForwarding turns IPv4 forwarding on when it is off and reports whether sandboxd is
// the one that did (now or earlier, the marker under /run says).
func enableForwarding() (guard bool, err error) {
	const knob = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(knob)
	if err != nil {
		return false, fmt.Errorf("gvisor: read %s: %w", knob, err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		_, err := os.Stat(forwardMarker)
		return err == nil, nil
	}
	if err := os.MkdirAll(filepath.Dir(forwardMarker), 0o755); err != nil {
		return false, fmt.Errorf("gvisor: %w", err)
	}
	if err := os.WriteFile(forwardMarker, nil, 0o644); err != nil {
		return false, fmt.Errorf("gvisor: %w", err)
	}
	if err := os.WriteFile(knob, []byte("1"), 0o644); err != nil {
		return false, fmt.Errorf("gvisor: turn IPv4 forwarding on for boxes with egress: %w", err)
	}
	return true, nil
}

// up makes a box's network namespace, links, addresses and rules, and returns the namespace's
// path (for the OCI spec) and the resolv.conf for the box. Whatever an earlier run left for
// the box is removed first; on error nothing is left.
func (n *netState) up(id string, p *runtime.NetworkPolicy) (nsPath string, err error) {
	if p == nil {
		return "", errors.New("gvisor: a box with egress needs its network policy")
	}
	if err := n.down(id); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			if derr := n.down(id); derr != nil {
				n.log.Error("cleaning up a box's network after a failed setup", "box", id, "err", derr)
			}
		}
	}()
	slot, err := n.allocSlot(id)
	if err != nil {
		return "", err
	}
	hostIP, boxIP := n.slotAddrs(slot)
	nsPath = n.nsPath(id)
	if err := newNetNS(nsPath); err != nil {
		return "", fmt.Errorf("gvisor: network namespace: %w", err)
	}
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return "", fmt.Errorf("gvisor: network namespace: %w", err)
	}
	defer nsh.Close()
	iface := n.iface(id)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: iface, MTU: 1500}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsh))}
	if err := netlink.LinkAdd(veth); err != nil {
		return "", fmt.Errorf("gvisor: veth %s: %w", iface, err)
	}
	host, err := netlink.LinkByName(iface)
	if err != nil {
		return "", fmt.Errorf("gvisor: veth %s: %w", iface, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(hostIP, 30)}); err != nil {
		return "", fmt.Errorf("gvisor: address of %s: %w", iface, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return "", fmt.Errorf("gvisor: %s up: %w", iface, err)
	}
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return "", fmt.Errorf("gvisor: netlink in the box's namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return "", fmt.Errorf("gvisor: loopback of the box's namespace: %w", err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return "", fmt.Errorf("gvisor: eth0 of the box's namespace: %w", err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(boxIP, 30)}); err != nil {
		return "", fmt.Errorf("gvisor: address of eth0: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return "", fmt.Errorf("gvisor: eth0 up: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(hostIP.AsSlice())}); err != nil {
		return "", fmt.Errorf("gvisor: default route of the box: %w", err)
	}
	unlock, err := n.lockNft()
	if err != nil {
		return "", err
	}
	defer unlock()
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("gvisor: nftables: %w", err)
	}
	if err := n.ensureTable(c); err != nil {
		return "", err
	}
	boxRuleset(c, n.table, id, iface, boxTag(id), boxIP, p)
	if err := c.Flush(); err != nil {
		return "", fmt.Errorf("gvisor: nftables rules of box %s: %w", id, err)
	}
	return nsPath, nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// down removes a box's rules, links, namespace and address slot, whichever exist. It is
// idempotent.
func (n *netState) down(id string) error {
	if _, err := os.Lstat(n.boxFile(id)); errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Lstat(n.nsPath(id)); errors.Is(err, fs.ErrNotExist) {
			if _, err := netlink.LinkByName(n.iface(id)); err != nil {
				return nil // the box never had a network (or it is gone already)
			}
		}
	}
	var errs []error
	if unlock, err := n.lockNft(); err != nil {
		errs = append(errs, err)
	} else {
		c, err := nftables.New()
		if err == nil {
			if _, terr := c.ListTableOfFamily(n.table.Name, n.table.Family); terr == nil {
				err = delBoxRuleset(c, n.table, id, boxTag(id))
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("gvisor: nftables rules of box %s: %w", id, err))
		}
	}
	if l, err := netlink.LinkByName(n.iface(id)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("gvisor: delete %s: %w", n.iface(id), err))
		}
	}
	if err := removeNetNS(n.nsPath(id)); err != nil {
		errs = append(errs, err)
	}
	if b, err := os.ReadFile(n.boxFile(id)); err == nil {
		slot := filepath.Join(n.slotDir(), strings.TrimSpace(string(b)))
		if owner, err := os.ReadFile(slot); err == nil && string(owner) == n.dir+" "+id {
			if err := os.Remove(slot); err != nil {
				errs = append(errs, fmt.Errorf("gvisor: network slot: %w", err))
			}
		}
		if err := os.Remove(n.boxFile(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newNetNS makes a network namespace pinned at path, on a thread of its own that is never
// given back to the Go scheduler (it ends with its goroutine), so no other goroutine runs in it.
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		done <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, "")
	}()
	if err := <-done; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// removeNetNS unmounts a pinned namespace (every mount stacked there) and removes its file.
func removeNetNS(path string) error {
	for range 8 {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break
			}
			return fmt.Errorf("gvisor: unmount %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

// reconcile removes the network of every box that has one but no running container (what a
// killed server or a crashed box left), and interfaces, chains and namespaces of this driver
// that no box owns. running tells whether a box's container runs.
func (n *netState) reconcile(ctx context.Context, running func(ctx context.Context, id string) bool) {
	owned := map[string]bool{}
	entries, _ := os.ReadDir(filepath.Join(n.dir, "boxes"))
	for _, e := range entries {
		id := e.Name()
		// A box whose network was made moments ago may be another server's create or start
		// in progress on this state folder: its container is not up yet.
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) < setupGrace || running(ctx, id) {
			owned[id] = true
			continue
		}
		if err := n.down(id); err != nil {
			n.log.Warn("removing a stopped box's network", "box", id, "err", err)
		} else {
			n.log.Info("removed the network a stopped box left", "box", id)
		}
	}
	tags := map[string]bool{}
	for id := range owned {
		tags[boxTag(id)] = true
	}
	// Namespaces without a box file.
	nss, _ := os.ReadDir(filepath.Join(n.dir, "ns"))
	for _, e := range nss {
		if !owned[e.Name()] {
			if err := n.down(e.Name()); err != nil {
				n.log.Warn("removing a leftover network namespace", "box", e.Name(), "err", err)
			}
		}
	}
	// Address slots of this state folder that no kept box holds: a create killed between
	// taking its slot and writing its box file left one nothing else names.
	slots, _ := os.ReadDir(n.slotDir())
	for _, e := range slots {
		path := filepath.Join(n.slotDir(), e.Name())
		owner, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		id, ours := strings.CutPrefix(string(owner), n.dir+" ")
		if !ours || !ValidID(id) || owned[id] {
			continue // another state folder's (a path with a space is no box id), or kept
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) < setupGrace {
			continue // another server's create, before its box file
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			n.log.Warn("removing a leftover network slot", "box", id, "err", err)
		}
	}
	// Interfaces and chains of this driver that no box owns.
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			name := l.Attrs().Name
			if strings.HasPrefix(name, n.prefix) && len(name) == len(n.prefix)+8 && !tags[name[len(n.prefix):]] {
				if err := netlink.LinkDel(l); err != nil {
					n.log.Warn("removing a leftover box interface", "link", name, "err", err)
				}
			}
		}
	}
	unlock, err := n.lockNft()
	if err != nil {
		return
	}
	defer unlock()
	c, err := nftables.New()
	if err != nil {
		return
	}
	if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err != nil {
		return
	}
	rules, _ := c.GetRules(n.table, &nftables.Chain{Name: chainBoxes, Table: n.table})
	for _, r := range rules {
		if !owned[string(r.UserData)] {
			_ = c.DelRule(r)
		}
	}
	chains, _ := c.ListChainsOfTableFamily(n.table.Family)
	for _, ch := range chains {
		if ch.Table.Name == n.table.Name && strings.HasPrefix(ch.Name, "box-") && !tags[strings.TrimPrefix(ch.Name, "box-")] {
			c.DelChain(ch)
		}
	}
	if err := c.Flush(); err != nil {
		n.log.Warn("removing leftover nftables rules", "err", err)
	}
}

// removeTable deletes the driver's table (when no box has egress any more, at Close).
func (n *netState) removeTableIfIdle() {
	entries, _ := os.ReadDir(filepath.Join(n.dir, "boxes"))
	if len(entries) > 0 {
		return
	}
	unlock, err := n.lockNft()
	if err != nil {
		return
	}
	defer unlock()
	c, err := nftables.New()
	if err != nil {
		return
	}
	if _, err := c.ListTableOfFamily(n.table.Name, n.table.Family); err != nil {
		return
	}
	c.DelTable(n.table)
	if err := c.Flush(); err != nil {
		n.log.Warn("removing the nftables table", "table", n.table.Name, "err", err)
	}
	n.tableDone = false
}
