package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandboxd/internal/apierror"
)

// hostPattern is one entry of Options.AllowHosts.
type hostPattern struct {
	host string // canonical (see canonHost)
	port string // "" for any
}

func parseHostPattern(p string) (hostPattern, error) {
	s := strings.TrimSpace(p)
	host, port := s, ""
	if h, pt, err := net.SplitHostPort(s); err == nil {
		host, port = h, pt
		if n, err := strconv.Atoi(pt); err != nil || n <= 0 || n > 65535 {
			return hostPattern{}, fmt.Errorf("source: allowed host %q: bad port", p)
		}
	}
	host = canonHost(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if host == "" || strings.ContainsAny(host, "/@ ") {
		return hostPattern{}, fmt.Errorf("source: allowed host %q is not a host or host:port", p)
	}
	return hostPattern{host: host, port: port}, nil
}

// canonHost lowercases a host name and drops a trailing dot; an IP address becomes its
// canonical form.
func canonHost(h string) string {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostAllowed reports whether host (as in a URL, without brackets) and port are allow-listed.
func (f *Fetcher) hostAllowed(host, port string) bool {
	h := canonHost(host)
	for _, p := range f.allow {
		if p.host == h && (p.port == "" || p.port == port) {
			return true
		}
	}
	return false
}

// blockedRanges are the addresses an archive URL may not reach unless its host is
// allow-listed: everything that is not a public unicast address.
var blockedRanges = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified (this-network) address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (cloud metadata lives here)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol-assignment address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a 6to4 relay address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/128"), "an unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// blocked says why a is not a public unicast address ("" when it is one). IPv4-mapped,
// NAT64 and 6to4 forms are judged by the IPv4 address they carry.
func blocked(a netip.Addr) string {
	a = a.WithZone("")
	if a.Is4In6() {
		if why := blocked(a.Unmap()); why != "" {
			return "the IPv4-mapped form of " + why
		}
		return ""
	}
	if a.Is6() && (nat64.Contains(a) || sixToFour.Contains(a)) {
		b := a.As16()
		var v4 [4]byte
		if nat64.Contains(a) {
			copy(v4[:], b[12:16])
		} else {
			copy(v4[:], b[2:6])
		}
		if why := blocked(netip.AddrFrom4(v4)); why != "" {
			return "the NAT64/6to4 form of " + why
		}
		return ""
	}
	for _, r := range blockedRanges {
		if r.prefix.Contains(a) {
			return r.what
		}
	}
	return ""
}

// blockedAddrError is a connection the dialer refused.
func blockedAddrError(host string, a netip.Addr, why string) *apierror.Error {
	return apierror.New(apierror.InvalidArgument,
		"archive URL host %q resolves to %s, %s, which is not allowed", host, a, why).
		WithDetail("host", host)
}

// parseURL parses an archive URL and checks its scheme and host (without resolving it).
func (f *Fetcher) parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, apierror.New(apierror.InvalidArgument, "archive URL is not a URL")
	}
	if err := f.checkScheme(u); err != nil {
		return nil, err
	}
	return u, nil
}

func (f *Fetcher) checkScheme(u *url.URL) error {
	host := u.Hostname()
	switch strings.ToLower(u.Scheme) {
	case "https":
	case "http":
		if host != "" && f.hostAllowed(host, portOf(u)) {
			break
		}
		return apierror.New(apierror.InvalidArgument,
			"archive URL %s uses http; only https is allowed", hostOf(u))
	default:
		return apierror.New(apierror.InvalidArgument,
			"archive URL scheme %q is not allowed; only https is", u.Scheme)
	}
	if host == "" {
		return apierror.New(apierror.InvalidArgument, "archive URL has no host")
	}
	return nil
}

// checkURL checks the scheme and, unless the host is allow-listed, that every address the
// host resolves to is public. It runs before the first request and before every redirect;
// the dialer checks again the address it actually connects to.
func (f *Fetcher) checkURL(ctx context.Context, u *url.URL) error {
	if err := f.checkScheme(u); err != nil {
		return err
	}
	host := u.Hostname()
	if f.hostAllowed(host, portOf(u)) {
		return nil
	}
	addrs, err := f.resolve(ctx, host)
	if err != nil {
		return f.netError(ctx, host, err)
	}
	for _, a := range addrs {
		if why := blocked(a); why != "" {
			return blockedAddrError(host, a, why)
		}
	}
	return nil
}

// resolve returns the addresses of host (itself when it is an IP address).
func (f *Fetcher) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	addrs, err := f.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, nil
}

// portOf is the port of u, explicit or by scheme.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "http") {
		return "80"
	}
	return "443"
}

// hostOf names u's host for messages (never the path or query: a signed URL's token is a
// secret, and a redirect's target is not the caller's to see).
func hostOf(u *url.URL) string {
	return fmt.Sprintf("%q", u.Host)
}

// dial connects to addr ("host:port" of a request): it resolves the host itself, refuses
// when any address is not public (unless the host is allow-listed) and connects only to the
// addresses it checked, so a DNS answer that changes between the check and the connect
// (rebinding) cannot reach another address. The dialer's Control hook checks the socket
// address once more right before connect(2).
func (f *Fetcher) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	allowed := f.hostAllowed(host, port)
	addrs, err := f.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	if !allowed {
		for _, a := range addrs {
			if why := blocked(a); why != "" {
				return nil, blockedAddrError(host, a, why)
			}
		}
	}
	d := net.Dialer{Timeout: f.opts.DialTimeout, KeepAlive: 30 * time.Second}
	if !allowed {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("source: unexpected socket address %q", address)
			}
			if why := blocked(ap.Addr().Unmap()); why != "" {
				return blockedAddrError(host, ap.Addr(), why)
			}
			return nil
		}
	}
	var first error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

func (f *Fetcher) newClient() *http.Client {
	tr := &http.Transport{
		Proxy:                  nil, // a proxy would connect on our behalf, past the address checks
		DialContext:            f.dial,
		TLSClientConfig:        &tls.Config{RootCAs: f.opts.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    f.opts.TLSHandshakeTimeout,
		ResponseHeaderTimeout:  f.opts.ResponseHeaderTimeout,
		ExpectContinueTimeout:  time.Second,
		DisableKeepAlives:      true, // one download per fetch: nothing idles after it
		DisableCompression:     true, // count and limit the bytes as sent
		ForceAttemptHTTP2:      true,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > MaxRedirects {
				return apierror.New(apierror.InvalidArgument,
					"archive URL redirects more than %d times", MaxRedirects)
			}
			if err := f.checkURL(req.Context(), req.URL); err != nil {
				if e := new(apierror.Error); errors.As(err, &e) && e.Code == apierror.InvalidArgument {
					e.Message = fmt.Sprintf("redirect to %s refused: %s", hostOf(req.URL), e.Message)
				}
				return err
			}
			return nil
		},
	}
}

var (
	errStalled = errors.New("source: download stalled")
	errTimeout = errors.New("source: download took too long")
	errClosed  = errors.New("source: stream closed")
)

// causeError is the error for a fetch whose context ended because of one of our own
// timeouts (nil when it ended for another reason: the caller's context).
func (f *Fetcher) causeError(ctx context.Context) error {
	switch c := context.Cause(ctx); {
	case errors.Is(c, errStalled):
		return f.unavailable(c, 0, "the archive download stalled: no data for %v", f.opts.StallTimeout)
	case errors.Is(c, errTimeout):
		return f.unavailable(c, 0, "the archive download took longer than %v", f.opts.Timeout)
	}
	return nil
}

// netError classifies an error of resolving host or of a request to it.
func (f *Fetcher) netError(ctx context.Context, host string, err error) error {
	if e := new(apierror.Error); errors.As(err, &e) {
		return e
	}
	if ctx.Err() != nil {
		if cerr := f.causeError(ctx); cerr != nil {
			return cerr
		}
		return ctx.Err()
	}
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) {
		return apierror.Wrap(err, apierror.InvalidArgument,
			"archive URL host %q has no valid TLS certificate", host)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return apierror.Wrap(err, apierror.InvalidArgument, "archive URL host %q does not resolve", host)
	}
	return f.unavailable(err, 0, "cannot fetch the archive from %q: %s", host, publicNetError(err))
}

// publicNetError is a short description of a network error, without addresses of ours.
func publicNetError(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	}
	return "network error"
}

// statusError classifies a response that is not 200.
func (f *Fetcher) statusError(u *url.URL, resp *http.Response) error {
	code := resp.StatusCode
	if code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500 {
		var retry time.Duration
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			retry = time.Duration(min(s, 3600)) * time.Second
		} else if t, err := http.ParseTime(resp.Header.Get("Retry-After")); err == nil {
			retry = min(time.Until(t), time.Hour)
		}
		return f.unavailable(nil, retry, "archive URL host %s answered %s", hostOf(u), resp.Status)
	}
	return apierror.New(apierror.InvalidArgument, "archive URL host %s answered %s", hostOf(u), resp.Status)
}
