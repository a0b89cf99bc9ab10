package source_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/source"
)

func TestBlockedAddresses(t *testing.T) {
	cases := []struct {
		addr string
		want string // part of the reason; "" for a public address
	}{
		{"127.0.0.1", "loopback"},
		{"127.8.9.10", "loopback"},
		{"::1", "loopback"},
		{"10.0.0.1", "private"},
		{"172.16.5.4", "private"},
		{"172.31.255.255", "private"},
		{"192.168.1.1", "private"},
		{"fc00::1", "private"},
		{"fd12:3456::1", "private"},
		{"169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "unspecified"},
		{"::", "unspecified"},
		{"224.0.0.1", "multicast"},
		{"ff02::1", "multicast"},
		{"100.64.0.1", "carrier-grade NAT"},
		{"100.127.255.254", "carrier-grade NAT"},
		{"255.255.255.255", "broadcast"},
		{"::ffff:127.0.0.1", "IPv4-mapped form of a loopback"},
		{"::ffff:169.254.169.254", "IPv4-mapped form of a link-local"},
		{"::ffff:10.1.2.3", "IPv4-mapped form of a private"},
		{"64:ff9b::a9fe:a9fe", "NAT64/6to4 form of a link-local"},
		{"2002:7f00:1::", "NAT64/6to4 form of a loopback"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"100.63.255.255", ""},
		{"100.128.0.0", ""},
		{"172.32.0.1", ""},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::808:808", ""},
		{"2606:4700:4700::1111", ""},
	}
	for _, c := range cases {
		got := source.Blocked(netip.MustParseAddr(c.addr))
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("Blocked(%s): got %q, want %q", c.addr, got, c.want)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []source.Options{
		{AllowHosts: []string{"a/b"}},
		{AllowHosts: []string{"host:99999"}},
		{AllowHosts: []string{""}},
		{MaxFiles: -1},
		{Timeout: -time.Second},
	} {
		if _, err := source.New(o); err == nil {
			t.Errorf("New(%+v): got no error, want one", o)
		}
	}
}

// URLs that are refused before any connection.
func TestArchiveRefusedURLs(t *testing.T) {
	s := newServer(t)
	s.put("/a.tar", tarBytes(t, happy))
	port := s.URL[strings.LastIndex(s.URL, ":")+1:]
	strict := s.fetcher(t, source.Options{AllowHosts: []string{}})
	allowOtherPort := s.fetcher(t, source.Options{AllowHosts: []string{"127.0.0.1:1"}})
	allowIP := s.fetcher(t, source.Options{AllowHosts: []string{"127.0.0.1"}})
	cases := []struct {
		name string
		f    *source.Fetcher
		url  string
		want []string
	}{
		{"LoopbackNotAllowListed", strict, s.URL + "/a.tar", []string{`"127.0.0.1"`, "loopback"}},
		{"OtherPortAllowListed", allowOtherPort, s.URL + "/a.tar", []string{"loopback"}},
		{"NameOfLoopback", allowIP, "https://localhost:" + port + "/a.tar", []string{`"localhost"`, "loopback"}},
		{"MappedLoopback", strict, "https://[::ffff:127.0.0.1]:" + port + "/a.tar", []string{"loopback"}},
		{"Metadata", strict, "https://169.254.169.254/latest/meta-data/", []string{"169.254.169.254", "link-local"}},
		{"Private", strict, "https://10.0.0.1/a.tar", []string{"10.0.0.1", "private"}},
		{"CGNAT", strict, "https://100.64.1.1/a.tar", []string{"carrier-grade NAT"}},
		{"Unspecified", strict, "https://0.0.0.0:" + port + "/a.tar", []string{"unspecified"}},
		{"IPv6Private", strict, "https://[fd00::1]/a.tar", []string{"private"}},
		{"HTTP", strict, "http://example.com/a.tar", []string{"http", "only https"}},
		{"HTTPNotAllowListed", allowOtherPort, "http://127.0.0.1:" + port + "/a.tar", []string{"only https"}},
		{"File", strict, "file:///etc/passwd", []string{`"file"`}},
		{"FTP", strict, "ftp://example.com/a.tar", []string{`"ftp"`}},
		{"Gopher", strict, "gopher://127.0.0.1:70/", []string{`"gopher"`}},
		{"NoScheme", strict, "example.com/a.tar", []string{"scheme"}},
		{"NoHost", strict, "https:///a.tar", []string{"no host"}},
		{"NotAURL", strict, "https://a b/%zz", []string{"not a URL"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := fetch(t, c.f, c.url)
			wantErr(t, err, apierror.InvalidArgument, c.want...)
			// CheckURL refuses the same, without connecting.
			wantErr(t, c.f.CheckURL(ctxT(t, time.Minute), c.url), apierror.InvalidArgument, c.want...)
		})
	}
}

// CheckURL passes what Archive would try to fetch: an allow-listed host, a public address.
func TestCheckURLPasses(t *testing.T) {
	s := newServer(t)
	f := s.fetcher(t, source.Options{})
	if err := f.CheckURL(ctxT(t, time.Minute), s.URL+"/missing.tar?sig=x"); err != nil {
		t.Errorf("allow-listed host: got %v, want nil", err)
	}
	public := s.fetcher(t, source.Options{AllowHosts: []string{}})
	source.SetLookup(public, func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
	})
	if err := public.CheckURL(ctxT(t, time.Minute), "https://files.example.com/a.tar.zst"); err != nil {
		t.Errorf("public host: got %v, want nil", err)
	}
}

func TestOptionsHaveDefaults(t *testing.T) {
	f, err := source.New(source.Options{MaxFiles: 7, AllowHosts: []string{"mirror.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	o := f.Options()
	if o.MaxFiles != 7 || o.MaxTotalBytes != source.DefaultMaxTotalBytes || o.MaxFileBytes != source.DefaultMaxTotalBytes ||
		o.MaxDownloadBytes != source.DefaultMaxDownloadBytes || o.Timeout != source.DefaultTimeout {
		t.Errorf("got %+v, want MaxFiles 7 and the defaults", o)
	}
	o.AllowHosts[0] = "changed"
	if got := f.Options().AllowHosts[0]; got != "mirror.internal" {
		t.Errorf("after changing a copy: got allow host %q, want mirror.internal", got)
	}
}

// Redirects: each hop is checked like the first URL, and there are at most five.
func TestArchiveRedirects(t *testing.T) {
	s := newServer(t)
	s.put("/a.tar", tarBytes(t, happy))
	other := newServer(t) // allow-listed by nobody
	other.put("/a.tar", tarBytes(t, happy))
	redirect := func(p, to string) {
		s.mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, to, http.StatusFound)
		})
	}
	for i := 1; i <= 6; i++ {
		redirect(fmt.Sprintf("/hop/%d", i), fmt.Sprintf("/hop/%d", i-1))
	}
	redirect("/hop/0", "/a.tar")
	f := s.fetcher(t, source.Options{})

	t.Run("FiveHops", func(t *testing.T) {
		if _, err := fetch(t, f, s.URL+"/hop/4"); err != nil {
			t.Errorf("got %v, want no error", err)
		}
	})
	t.Run("SixHops", func(t *testing.T) {
		_, err := fetch(t, f, s.URL+"/hop/5")
		wantErr(t, err, apierror.InvalidArgument, "more than 5")
	})
	targets := []struct {
		name, to string
		want     []string
	}{
		{"Metadata", "https://169.254.169.254/computeMetadata/v1/", []string{"redirect", "169.254.169.254", "link-local"}},
		{"MetadataHTTP", "http://169.254.169.254/latest/meta-data/", []string{"redirect", "only https"}},
		{"MappedMetadata", "https://[::ffff:169.254.169.254]/", []string{"redirect", "link-local"}},
		{"Private", "https://10.0.0.1/a.tar", []string{"redirect", "10.0.0.1", "private"}},
		{"OtherLoopbackServer", other.URL + "/a.tar", []string{"redirect", "loopback"}},
		{"LocalhostName", "https://localhost:" + s.URL[strings.LastIndex(s.URL, ":")+1:] + "/a.tar", []string{"redirect", "localhost"}},
		{"File", "file:///etc/passwd", []string{"redirect", `"file"`}},
	}
	for _, c := range targets {
		t.Run(c.name, func(t *testing.T) {
			redirect("/to/"+c.name, c.to)
			_, err := fetch(t, f, s.URL+"/to/"+c.name)
			wantErr(t, err, apierror.InvalidArgument, c.want...)
		})
	}
}

// A host name that resolves to a public address when checked and to loopback when the
// connection is made (DNS rebinding) is refused: the dialer connects only to addresses it
// has checked itself.
func TestArchiveDNSRebinding(t *testing.T) {
	s := newServer(t)
	s.put("/a.tar", tarBytes(t, happy))
	f := s.fetcher(t, source.Options{AllowHosts: []string{}})
	var calls atomic.Int32
	source.SetLookup(f, func(ctx context.Context, host string) ([]netip.Addr, error) {
		if host != "rebind.example" {
			return nil, fmt.Errorf("unexpected lookup of %q", host)
		}
		if calls.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	})
	port := s.URL[strings.LastIndex(s.URL, ":")+1:]
	_, err := fetch(t, f, "https://rebind.example:"+port+"/a.tar")
	wantErr(t, err, apierror.InvalidArgument, `"rebind.example"`, "127.0.0.1", "loopback")
	if n := calls.Load(); n < 2 {
		t.Errorf("got %d lookups, want the dialer's own after the check", n)
	}
}

// Plain http works for an allow-listed host (tests, internal mirrors).
func TestArchiveHTTPAllowListed(t *testing.T) {
	mux := http.NewServeMux()
	body := tarBytes(t, happy)
	mux.HandleFunc("GET /a.tar", func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	ts := httptest.NewServer(mux)
	defer ts.Close()
	f, err := source.New(source.Options{AllowHosts: []string{ts.Listener.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := fetch(t, f, ts.URL+"/a.tar")
	if err != nil || len(got) != len(happyOut) {
		t.Errorf("got %d entries, %v; want %d, no error", len(got), err, len(happyOut))
	}
}

// HTTP answers and network failures: a client error is INVALID_ARGUMENT, a server error or
// a broken network UNAVAILABLE with a retry hint.
func TestArchiveHTTPErrors(t *testing.T) {
	s := newServer(t)
	s.mux.HandleFunc("GET /busy", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	s.mux.HandleFunc("GET /broken", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	s.mux.HandleFunc("GET /cut", func(w http.ResponseWriter, r *http.Request) {
		b := tarBytes(t, ents(regN("f", 100_000)))
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b[:5000])
		panic(http.ErrAbortHandler) // the connection breaks before Content-Length bytes
	})
	f := s.fetcher(t, source.Options{RetryAfter: 3 * time.Second})

	t.Run("NotFound", func(t *testing.T) {
		_, err := fetch(t, f, s.URL+"/missing")
		wantErr(t, err, apierror.InvalidArgument, "404")
	})
	t.Run("ServiceUnavailable", func(t *testing.T) {
		_, err := fetch(t, f, s.URL+"/busy")
		wantErr(t, err, apierror.Unavailable, "503")
		if got := apierror.From(err).RetryAfter; got != 7*time.Second {
			t.Errorf("got RetryAfter %v, want 7s", got)
		}
	})
	t.Run("ServerError", func(t *testing.T) {
		_, err := fetch(t, f, s.URL+"/broken")
		wantErr(t, err, apierror.Unavailable, "500")
		if got := apierror.From(err).RetryAfter; got != 3*time.Second {
			t.Errorf("got RetryAfter %v, want 3s", got)
		}
	})
	t.Run("BrokenMidway", func(t *testing.T) {
		_, err := fetch(t, f, s.URL+"/cut")
		wantErr(t, err, apierror.Unavailable, "broke")
		if apierror.From(err).RetryAfter <= 0 {
			t.Error("got no RetryAfter, want one")
		}
	})
	t.Run("ConnectionRefused", func(t *testing.T) {
		gone := httptest.NewTLSServer(http.NotFoundHandler())
		url, host := gone.URL, gone.Listener.Addr().String()
		gone.Close()
		f, err := source.New(source.Options{AllowHosts: []string{host}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = fetch(t, f, url+"/a.tar")
		wantErr(t, err, apierror.Unavailable, "connection refused")
		if apierror.From(err).RetryAfter <= 0 {
			t.Error("got no RetryAfter, want one")
		}
	})
	t.Run("UntrustedCertificate", func(t *testing.T) {
		f, err := source.New(source.Options{AllowHosts: []string{s.host()}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = fetch(t, f, s.URL+"/missing")
		wantErr(t, err, apierror.InvalidArgument, "TLS certificate")
	})
}

// A download that stalls is UNAVAILABLE after StallTimeout; the caller's own deadline ends
// the fetch with the caller's error.
func TestArchiveStall(t *testing.T) {
	s := newServer(t)
	body := tarBytes(t, ents(regN("f", 100_000)))
	s.mux.HandleFunc("GET /stall", func(w http.ResponseWriter, r *http.Request) {
		w.Write(body[:4096])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	t.Run("StallTimeout", func(t *testing.T) {
		f := s.fetcher(t, source.Options{StallTimeout: 300 * time.Millisecond})
		_, err := fetch(t, f, s.URL+"/stall")
		wantErr(t, err, apierror.Unavailable, "stalled")
	})
	t.Run("CallerDeadline", func(t *testing.T) {
		f := s.fetcher(t, source.Options{})
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		rc, err := f.Archive(ctx, s.URL+"/stall")
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if err != context.DeadlineExceeded {
			t.Errorf("got %v, want context.DeadlineExceeded", err)
		}
	})
}
