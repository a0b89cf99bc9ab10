package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"sandboxd/tests/e2e"
)

// probeScript tries a TCP connection to each host:port of its arguments (a host name resolves
// through the sandbox's resolv.conf), sends an HTTP request, and prints a JSON object:
// "ok <body>" or "error <errno>" or "timeout" per target.
const probeScript = `
import socket, sys, json
out = {}
for t in sys.argv[1:]:
    h, p = t.rsplit(":", 1)
    try:
        s = socket.create_connection((h, int(p)), timeout=3)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        d = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            d += c
        s.close()
        out[t] = "ok " + d.decode(errors="replace").split("\r\n\r\n", 1)[-1].strip()
    except socket.timeout:
        out[t] = "timeout"
    except socket.gaierror as e:
        out[t] = "dns %s" % e.errno
    except OSError as e:
        out[t] = "error %s" % e.errno
print(json.dumps(out))
`

// probe runs probeScript in a sandbox and returns what each target gave.
func probe(t *testing.T, srv *e2e.Server, id string, targets ...string) map[string]string {
	t.Helper()
	out := srv.Run(t, id, append([]string{"python3", "-c", probeScript}, targets...), e2e.HdrTenant1)
	var res map[string]string
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return res
}

// wantProbes checks each target: "nethost A" wants a connection answered by that test host
// address, "refused" an answer that there is none (a reset, an ICMP error, no route: what the
// policy's reject gives, at once), "denied" no connection in any way (refused, unreachable or
// timed out: what a dropped packet gives).
func wantProbes(t *testing.T, who string, got map[string]string, want map[string]string) {
	t.Helper()
	for target, w := range want {
		g := got[target]
		switch {
		case strings.HasPrefix(w, "nethost "):
			if g != "ok "+w {
				t.Errorf("%s → %s: got %q, want an answer %q", who, target, g, w)
			}
		case w == "denied":
			if strings.HasPrefix(g, "ok") || g == "" {
				t.Errorf("%s → %s: got %q, want no connection", who, target, g)
			}
		case w == "refused":
			if !strings.HasPrefix(g, "error ") {
				t.Errorf("%s → %s: got %q, want the connection refused (error errno)", who, target, g)
			}
		default:
			t.Fatalf("bad expectation %q", w)
		}
	}
}

// netSubnetOctet picks a third octet for this process's test subnets, so that test binaries
// running at once on one machine do not share one.
func netSubnetOctet(offset int) int { return (os.Getpid()+offset)%200 + 20 }

// networkProfiles are the profiles of the network tests: the document's (none), one open to
// every public address, and one with an allow list.
func networkProfiles(allow []string, deny []string) []map[string]any {
	return []map[string]any{
		{"name": "sandboxes-default", "rootfs": e2e.Rootfs(), "memory_mb": 512},
		{"name": "open", "rootfs": e2e.Rootfs(), "memory_mb": 512, "network": "egress", "egress_allow": []string{"0.0.0.0/0"}},
		{"name": "listed", "rootfs": e2e.Rootfs(), "memory_mb": 512, "network": "egress", "egress_allow": allow, "egress_deny": deny},
	}
}

// TestNetworkPolicyLocal: egress policies enforced on the local runtime, with real traffic only
// to test hosts in namespaces the test made: an allowed CIDR answers, a denied one does not,
// none has only loopback, the metadata range and private ranges stay closed under 0.0.0.0/0
// unless listed (inside or exactly), DNS goes only to the configured resolver, a host name
// allows only the address it was pinned to, no sandbox reaches another or the host, a create
// can narrow and never widen, and nothing is left behind after destroy.
func TestNetworkPolicyLocal(t *testing.T) {
	t.Parallel()
	n := netSubnetOctet(0)
	b := e2e.StartNetHost(t, fmt.Sprintf("198.19.%d.0/24", n), []int{2, 3}, nil)
	a := e2e.StartNetHost(t, fmt.Sprintf("198.18.%d.0/24", n), []int{2, 5}, map[string]string{
		"svc.sandboxd.test": b.Addrs[0].String(), "other.sandboxd.test": b.Addrs[1].String()})
	meta := e2e.StartNetHost(t, fmt.Sprintf("169.254.%d.0/24", n), []int{77}, nil)
	priv := e2e.StartNetHost(t, fmt.Sprintf("10.254.%d.0/24", n), []int{2}, nil)
	A2, A5, B2, B3 := a.Addrs[0].String(), a.Addrs[1].String(), b.Addrs[0].String(), b.Addrs[1].String()
	M, P := meta.Addrs[0].String(), priv.Addrs[0].String()

	srv := e2e.StartServer(t, e2e.ServerOptions{Extra: map[string]any{
		// The listed profile names the link-local range exactly: listing an always-denied
		// range opens it, as P (inside 10/8) opens just itself.
		"profiles": networkProfiles([]string{a.Subnet.String(), "svc.sandboxd.test", P, "169.254.0.0/16"}, []string{A5}),
		"network":  map[string]any{"dns_servers": []string{A2}},
	}})

	var none, open, open2, listed e2e.SandboxJSON
	var wg sync.WaitGroup
	for _, c := range []struct {
		sb   *e2e.SandboxJSON
		body string
	}{{&none, `{}`}, {&open, `{"profile":"open"}`}, {&open2, `{"profile":"open"}`}, {&listed, `{"profile":"listed"}`}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			*c.sb = srv.Create(t, c.body, e2e.HdrTenant1)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	t.Run("none has only loopback", func(t *testing.T) {
		wantProbes(t, "none", probe(t, srv, none.SandboxID, A2+":80", B2+":80"),
			map[string]string{A2 + ":80": "refused", B2 + ":80": "refused"})
		links := srv.Run(t, none.SandboxID, []string{"python3", "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"}, e2e.HdrTenant1)
		if strings.TrimSpace(links) != "['lo']" {
			t.Errorf("a sandbox without network has interfaces %s, want only lo", links)
		}
	})

	t.Run("open", func(t *testing.T) {
		wantProbes(t, "open", probe(t, srv, open.SandboxID, A2+":80", A5+":80", B3+":80", "svc.sandboxd.test:80",
			M+":80", P+":80", a.Gateway.String()+":80", B2+":53", A2+":53"),
			map[string]string{
				A2 + ":80": "nethost " + A2, A5 + ":80": "nethost " + A5, B3 + ":80": "nethost " + B3,
				"svc.sandboxd.test:80":     "nethost " + B2, // resolved by the configured resolver
				M + ":80":                  "refused",       // the link-local (metadata) range, under 0.0.0.0/0
				P + ":80":                  "refused",       // a private range, under 0.0.0.0/0
				a.Gateway.String() + ":80": "refused",       // the host itself
				B2 + ":53":                 "refused",       // DNS elsewhere than the resolver
				A2 + ":53":                 "nethost " + A2,
			})
	})

	t.Run("listed", func(t *testing.T) {
		wantProbes(t, "listed", probe(t, srv, listed.SandboxID, A2+":80", A5+":80", "svc.sandboxd.test:80", B3+":80",
			"other.sandboxd.test:80", P+":80", M+":80", B2+":53"),
			map[string]string{
				A2 + ":80":               "nethost " + A2,
				A5 + ":80":               "refused",       // egress_deny inside the allowed subnet
				"svc.sandboxd.test:80":   "nethost " + B2, // the pinned address of an allowed name
				B3 + ":80":               "refused",       // not pinned
				"other.sandboxd.test:80": "refused",       // resolves (DNS is allowed), but is not allowed
				P + ":80":                "nethost " + P,  // a private address listed explicitly
				M + ":80":                "nethost " + M,  // the always-denied range it names exactly
				B2 + ":53":               "refused",
			})
		got := srv.Get(t, listed.SandboxID, e2e.HdrTenant1)
		r := srv.Curl(t, http.MethodGet, e2e.Prefix+"/"+got.SandboxID, nil, e2e.HdrTenant1)
		var pol struct {
			Network       string `json:"network"`
			NetworkPolicy struct {
				Mode        string              `json:"mode"`
				EgressAllow []string            `json:"egress_allow"`
				EgressDeny  []string            `json:"egress_deny"`
				AlwaysDeny  []string            `json:"always_deny"`
				DNSServers  []string            `json:"dns_servers"`
				Pinned      map[string][]string `json:"pinned"`
			} `json:"network_policy"`
		}
		r.Decode(t, &pol)
		p := pol.NetworkPolicy
		if pol.Network != "egress" || p.Mode != "egress" || !slices.Equal(p.Pinned["svc.sandboxd.test"], []string{B2}) ||
			!slices.Contains(p.AlwaysDeny, "169.254.0.0/16") || !slices.Equal(p.DNSServers, []string{A2}) ||
			!slices.Equal(p.EgressDeny, []string{A5 + "/32"}) || !slices.Contains(p.EgressAllow, P+"/32") {
			t.Errorf("reported policy: %s", r.Body)
		}
		g := srv.GQL(t, `query($id: ID!) { sandbox(id: $id) { network networkPolicy { mode egressAllow pinned { host addresses } } } }`,
			map[string]any{"id": listed.SandboxID}, e2e.HdrTenant1)
		if s := g.String(); !strings.Contains(s, `"mode":"EGRESS"`) || !strings.Contains(s, `"addresses":["`+B2+`"]`) {
			t.Errorf("GraphQL networkPolicy: %s", s)
		}
	})

	t.Run("stop and start keep the policy", func(t *testing.T) {
		srv.Curl(t, http.MethodPost, e2e.Prefix+"/"+listed.SandboxID+"/stop", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		if left := networkLeftovers(t, srv.State.Dir); slices.ContainsFunc(left, func(s string) bool { return strings.Contains(s, listed.SandboxID) }) {
			t.Errorf("a stopped sandbox keeps its network: %v", left)
		}
		srv.Curl(t, http.MethodPost, e2e.Prefix+"/"+listed.SandboxID+"/start", nil, e2e.HdrTenant1).Want(t, http.StatusOK)
		wantProbes(t, "listed after a start", probe(t, srv, listed.SandboxID, A2+":80", A5+":80", "svc.sandboxd.test:80"),
			map[string]string{A2 + ":80": "nethost " + A2, A5 + ":80": "refused", "svc.sandboxd.test:80": "nethost " + B2})
	})

	t.Run("no sandbox reaches another", func(t *testing.T) {
		// open2 listens; its own address is the source of its connection to a test host.
		ip := strings.TrimSpace(srv.Run(t, open2.SandboxID, []string{"python3", "-c",
			"import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.connect(('" + A2 + "',80));print(s.getsockname()[0])"}, e2e.HdrTenant1))
		srv.Curl(t, http.MethodPost, e2e.Prefix+"/"+open2.SandboxID+"/exec",
			[]byte(`{"command":["python3","-c","import http.server as h; h.HTTPServer(('0.0.0.0',9000),h.SimpleHTTPRequestHandler).serve_forever()"],"wait":false}`),
			e2e.HdrJSON, e2e.HdrTenant1).Want(t, http.StatusAccepted)
		deadline := time.Now().Add(10 * time.Second)
		for {
			res := probe(t, srv, open2.SandboxID, "127.0.0.1:9000")
			if strings.HasPrefix(res["127.0.0.1:9000"], "ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("open2's listener does not answer on its loopback: %v", res)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for who, id := range map[string]string{"open": open.SandboxID, "listed": listed.SandboxID} {
			wantProbes(t, who, probe(t, srv, id, ip+":9000"), map[string]string{ip + ":9000": "denied"})
		}
	})

	t.Run("a create narrows and never widens", func(t *testing.T) {
		narrowed := srv.Create(t, `{"profile":"open","network":{"mode":"egress","egress_allow":["`+a.Subnet.String()+`"]}}`, e2e.HdrTenant1)
		wantProbes(t, "narrowed", probe(t, srv, narrowed.SandboxID, A2+":80", B2+":80"),
			map[string]string{A2 + ":80": "nethost " + A2, B2 + ":80": "refused"})
		off := srv.Create(t, `{"profile":"open","network":"none"}`, e2e.HdrTenant1)
		wantProbes(t, "narrowed to none", probe(t, srv, off.SandboxID, A2+":80"), map[string]string{A2 + ":80": "refused"})
		for _, c := range []struct {
			body   string
			status int
			code   string
		}{
			{`{"profile":"listed","network":{"mode":"egress","egress_allow":["` + b.Subnet.String() + `"]}}`, 403, "PERMISSION_DENIED"},
			{`{"profile":"listed","network":{"mode":"egress","egress_allow":["other.sandboxd.test"]}}`, 403, "PERMISSION_DENIED"},
			{`{"profile":"open","network":{"mode":"egress","egress_allow":["169.254.169.254"]}}`, 403, "PERMISSION_DENIED"},
			{`{"network":{"mode":"egress"}}`, 403, "PERMISSION_DENIED"},
			{`{"profile":"open","network":{"mode":"egress","egress_allow":["2001:db8::/32"]}}`, 400, "INVALID_ARGUMENT"},
			{`{"profile":"open","network":{"mode":"egress","egress_allow":["198.18.0.1/16"]}}`, 400, "INVALID_ARGUMENT"},
			{`{"profile":"open","network":{"mode":"bridge"}}`, 400, "INVALID_ARGUMENT"},
			{`{"profile":"open","network":{"mode":"egress","egress_allow":"0.0.0.0/0"}}`, 400, "INVALID_ARGUMENT"},
			{`{"profile":"open","network":{"mode":"egress","egress_allow":[` + strings.Repeat(`"1.1.1.1",`, 64) + `"1.1.1.2"]}}`, 400, "INVALID_ARGUMENT"},
		} {
			srv.Curl(t, http.MethodPost, e2e.Prefix, []byte(c.body), e2e.HdrJSON, e2e.HdrTenant1).WantError(t, c.status, c.code)
		}
		// The same through GraphQL: a narrowing to none, and a widening refused by code.
		const create = `mutation($in: CreateSandboxInput!) { createSandbox(input: $in) { sandbox { id network networkPolicy { mode egressAllow } } } }`
		g := srv.GQL(t, create, map[string]any{"in": map[string]any{"profile": "open", "network": map[string]any{"mode": "NONE"}}}, e2e.HdrTenant1)
		var out struct {
			ID            string `json:"id"`
			Network       string `json:"network"`
			NetworkPolicy struct {
				Mode string `json:"mode"`
			} `json:"networkPolicy"`
		}
		g.OK(t, "createSandbox.sandbox", &out)
		srv.Track(out.ID, e2e.HdrTenant1)
		if out.Network != "none" || out.NetworkPolicy.Mode != "NONE" {
			t.Errorf("GraphQL create narrowed to none: %s", g)
		}
		srv.GQL(t, create, map[string]any{"in": map[string]any{"profile": "listed", "network": map[string]any{
			"mode": "EGRESS", "egressAllow": []string{b.Subnet.String()}}}}, e2e.HdrTenant1).WantCode(t, http.StatusOK, "PERMISSION_DENIED")
	})

	for _, id := range srv.ListAll(t, e2e.HdrTenant1).Sandboxes {
		srv.Curl(t, http.MethodDelete, e2e.Prefix+"/"+id.SandboxID, nil, e2e.HdrTenant1).Want(t, http.StatusOK)
	}
	if left := networkLeftovers(t, srv.State.Dir); len(left) > 0 {
		t.Errorf("left behind after destroy: %v", left)
	}
}

// TestNetworkPolicyKill: kill -9 of the server leaves the network of a running sandbox working
// (a restart keeps it), and what a killed create or destroy left is removed: nothing is left
// once the sandboxes are gone.
func TestNetworkPolicyKill(t *testing.T) {
	t.Parallel()
	n := netSubnetOctet(100)
	a := e2e.StartNetHost(t, fmt.Sprintf("198.18.%d.0/24", n), []int{2}, nil)
	A2 := a.Addrs[0].String()
	opts := e2e.ServerOptions{Extra: map[string]any{
		"profiles": networkProfiles([]string{a.Subnet.String()}, nil),
		"network":  map[string]any{"dns_servers": []string{A2}},
	}}
	srv := e2e.StartServer(t, opts)
	kept := srv.Create(t, `{"profile":"listed"}`, e2e.HdrTenant1)
	wantProbes(t, "before the kill", probe(t, srv, kept.SandboxID, A2+":80"), map[string]string{A2 + ":80": "nethost " + A2})
	srv.Kill(t)

	opts.State = srv.State
	srv = e2e.StartServer(t, opts)
	wantProbes(t, "after the restart", probe(t, srv, kept.SandboxID, A2+":80"), map[string]string{A2 + ":80": "nethost " + A2})

	// Kill the server in the middle of a create, once the box's network exists.
	nsDir := filepath.Join(srv.State.Dir, "net", "ns")
	created := make(chan struct{})
	go func() {
		defer close(created)
		_, _ = srv.Send(http.MethodPost, e2e.Prefix, strings.NewReader(`{"profile":"listed"}`), e2e.HdrJSON, e2e.HdrTenant1)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		entries, _ := os.ReadDir(nsDir)
		if len(entries) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second create made no network namespace in 30 s: the kill would not land in it")
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.Kill(t)
	<-created
	// And in the middle of a destroy.
	srv = e2e.StartServer(t, opts)
	destroyed := make(chan struct{})
	go func() {
		defer close(destroyed)
		_, _ = srv.Send(http.MethodDelete, e2e.Prefix+"/"+kept.SandboxID, nil, e2e.HdrTenant1)
	}()
	time.Sleep(150 * time.Millisecond)
	srv.Kill(t)
	<-destroyed

	srv = e2e.StartServer(t, opts)
	// The reconciler finishes or fails what the kills interrupted; then everything goes.
	deadline = time.Now().Add(90 * time.Second)
	for {
		busy := false
		for _, sb := range srv.ListAll(t, e2e.HdrTenant1).Sandboxes {
			switch sb.State {
			case "CREATING", "DESTROYING", "STOPPING", "STARTING":
				busy = true
			case "DESTROYED":
			default:
				r := srv.Curl(t, http.MethodDelete, e2e.Prefix+"/"+sb.SandboxID, nil, e2e.HdrTenant1)
				if r.Status != http.StatusOK && r.Status != http.StatusNotFound {
					busy = true
				}
			}
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes still busy: %+v", srv.ListAll(t, e2e.HdrTenant1).Sandboxes)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if left := networkLeftovers(t, srv.State.Dir); len(left) > 0 {
		t.Errorf("left behind after the kills and destroys: %v", left)
	}
}

// networkLeftovers lists what the local driver's networks left of a state folder: pinned
// namespaces, box files, address slots, interfaces, nftables box chains and dispatch rules.
func networkLeftovers(t *testing.T, stateDir string) []string {
	t.Helper()
	var left []string
	for _, sub := range []string{"ns", "boxes"} {
		entries, _ := os.ReadDir(filepath.Join(stateDir, "net", sub))
		for _, e := range entries {
			left = append(left, "net/"+sub+"/"+e.Name())
		}
	}
	// A netns is pinned by a bind mount onto its file in net/ns: the file gone and the mount
	// left would hold the namespace (and its veth end) alive where no listing above finds it.
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(stateDir, "net")+"/") {
			left = append(left, "mount "+f[4])
		}
	}
	slots, _ := filepath.Glob("/run/sandboxd/net-slots/*/*")
	for _, s := range slots {
		if b, err := os.ReadFile(s); err == nil && strings.HasPrefix(string(b), filepath.Join(stateDir, "net")+" ") {
			left = append(left, "slot "+s)
		}
	}
	sum := sha256.Sum256([]byte(stateDir))
	tag := hex.EncodeToString(sum[:])[:5]
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "sb"+tag) {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: "sandboxd-" + tag, Family: nftables.TableFamilyINet}
	if _, err := c.ListTableOfFamily(table.Name, table.Family); err == nil {
		chains, _ := c.ListChainsOfTableFamily(table.Family)
		for _, ch := range chains {
			if ch.Table.Name == table.Name && strings.HasPrefix(ch.Name, "box-") {
				left = append(left, "nft chain "+ch.Name)
			}
		}
		rules, _ := c.GetRules(table, &nftables.Chain{Name: "boxes", Table: table})
		for _, r := range rules {
			left = append(left, "nft rule for "+string(r.UserData))
		}
	}
	return left
}
