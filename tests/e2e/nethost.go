package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// NetHost is a test host the test made itself: a network namespace of its own on a private
// test subnet, joined to the host by a veth pair (the host's end is the subnet's .1), with an
// HTTP server on ports 80 and 53 (TCP) of each of its addresses (it answers "nethost <address>")
// and, when
// it has DNS answers, a DNS server on UDP port 53 of its first address. Sandboxes' traffic goes
// only to such hosts.
type NetHost struct {
	// Subnet is the host's /24; Gateway its .1, the host's end of the veth.
	Subnet  netip.Prefix
	Gateway netip.Addr
	// Addrs are the test host's addresses (the first one serves DNS).
	Addrs []netip.Addr

	ns   string
	link string
	cmd  *exec.Cmd
}

// netHostEnv carries a test host's serve spec to the test binary run inside its namespace.
const netHostEnv = "E2E_NETHOST_SERVE"

type netHostSpec struct {
	Addrs []string          `json:"addrs"`
	DNS   map[string]string `json:"dns"`
}

// StartNetHost makes a test host on subnet (a /24 that no route of this machine overlaps) with
// the given host numbers (2 → .2), answering dns (name → IPv4) when it is not empty. It is
// removed when the test ends.
func StartNetHost(t *testing.T, subnet string, hosts []int, dns map[string]string) *NetHost {
	t.Helper()
	p := netip.MustParsePrefix(subnet)
	if p.Bits() != 24 || !p.Addr().Is4() {
		t.Fatalf("test host subnet %s: want an IPv4 /24", subnet)
	}
	if out, err := exec.Command("ip", "-4", "route", "show", "to", "match", p.Addr().Next().String()).Output(); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "" && !strings.HasPrefix(line, "default") {
				t.Fatalf("test host subnet %s overlaps a route of this machine: %s", subnet, line)
			}
		}
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	h := &NetHost{Subnet: p, Gateway: p.Addr().Next(), ns: "e2e-nethost-" + tag, link: "tnh" + tag}
	octets := p.Addr().As4()
	for _, n := range hosts {
		octets[3] = byte(n)
		h.Addrs = append(h.Addrs, netip.AddrFrom4(octets))
	}
	t.Cleanup(func() { h.remove(t) })
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", h.ns)
	run("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
	run("addr", "add", h.Gateway.String()+"/24", "dev", h.link)
	run("link", "set", h.link, "up")
	for _, a := range h.Addrs {
		run("-n", h.ns, "addr", "add", a.String()+"/24", "dev", "eth0")
	}
	run("-n", h.ns, "link", "set", "eth0", "up")
	run("-n", h.ns, "link", "set", "lo", "up")
	run("-n", h.ns, "route", "add", "default", "via", h.Gateway.String())
	spec := netHostSpec{DNS: dns}
	for _, a := range h.Addrs {
		spec.Addrs = append(spec.Addrs, a.String())
	}
	b, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command("ip", "netns", "exec", h.ns, self)
	h.cmd.Env = append(os.Environ(), netHostEnv+"="+string(b))
	h.cmd.Stdout, h.cmd.Stderr = os.Stderr, os.Stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("starting the test host's servers: %v", err)
	}
	// Ready when every address answers from the host's side.
	c := &http.Client{Timeout: time.Second}
	for _, a := range h.Addrs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := c.Get("http://" + a.String() + "/")
			if err == nil {
				resp.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("test host %s does not answer: %v", a, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return h
}

func (h *NetHost) remove(t *testing.T) {
	if h.cmd != nil && h.cmd.Process != nil {
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
	}
	_ = exec.Command("ip", "link", "del", h.link).Run()
	if out, err := exec.Command("ip", "netns", "del", h.ns).CombinedOutput(); err != nil {
		t.Logf("removing test host namespace %s: %v: %s", h.ns, err, out)
	}
}

// serveNetHost runs a test host's servers (inside its namespace) until it is killed.
func serveNetHost(specJSON string) int {
	var spec netHostSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "nethost:", err)
		return 2
	}
	var wg sync.WaitGroup
	for _, a := range spec.Addrs {
		for _, port := range []string{"80", "53"} {
			ln, err := net.Listen("tcp", net.JoinHostPort(a, port))
			if err != nil {
				fmt.Fprintln(os.Stderr, "nethost:", err)
				return 2
			}
			addr := a
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					fmt.Fprintf(w, "nethost %s\n", addr)
				}))
			}()
		}
	}
	if len(spec.DNS) > 0 && len(spec.Addrs) > 0 {
		pc, err := net.ListenPacket("udp", net.JoinHostPort(spec.Addrs[0], "53"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "nethost:", err)
			return 2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveDNS(pc, spec.DNS)
		}()
	}
	wg.Wait()
	return 0
}

// serveDNS answers A questions for the names it has, NXDOMAIN for the others.
func serveDNS(pc net.PacketConn, answers map[string]string) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		hdr, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		resp := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true})
		resp.EnableCompression()
		ip, ok := answers[strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")]
		if !ok {
			resp = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: hdr.ID, Response: true, RCode: dnsmessage.RCodeNameError})
		}
		_ = resp.StartQuestions()
		_ = resp.Question(q)
		if ok && q.Type == dnsmessage.TypeA {
			_ = resp.StartAnswers()
			a := netip.MustParseAddr(ip).As4()
			_ = resp.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a})
		}
		out, err := resp.Finish()
		if err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}
