package httpwork

import (
	"errors"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The oracles below are written independently of the code under test, with
// the net package's older parser, so a shared mistake is unlikely.

// oracleSpecial reports whether ip is one of the ranges the issue names:
// loopback, private, link-local, CGNAT, unspecified, multicast (net.IP
// judges IPv4-mapped IPv6 as the IPv4 address).
func oracleSpecial(ip net.IP) bool {
	_, cgnat, _ := net.ParseCIDR("100.64.0.0/10")
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || cgnat.Contains(ip)
}

// oracleIP parses a URL host as an IP address, without its zone.
func oracleIP(host string) net.IP {
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	return net.ParseIP(host)
}

// oracleInetAton reports whether the C library's inet_aton would read host
// as an IPv4 address: one to four parts, each decimal, 0-octal or 0x-hex.
func oracleInetAton(host string) bool {
	host = strings.TrimSuffix(host, ".")
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		if p == "" {
			return false
		}
		base := 10
		switch {
		case strings.HasPrefix(strings.ToLower(p), "0x"):
			base, p = 16, p[2:]
			if p == "" {
				continue
			}
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		if _, err := strconv.ParseUint(p, base, 32); err != nil {
			return false
		}
	}
	return true
}

// oracleEntry splits an allow-list entry into host and port text.
func oracleEntry(e string) (host, port string) {
	e = strings.TrimSpace(e)
	if strings.HasPrefix(e, "[") {
		end := strings.IndexByte(e, ']')
		return e[1:end], strings.TrimPrefix(e[end+1:], ":")
	}
	host, port, _ = strings.Cut(e, ":")
	return host, port
}

func oraclePortAllowed(entryPort string, port int) bool {
	switch entryPort {
	case "*":
		return true
	case "":
		return port == 80 || port == 443
	}
	n, err := strconv.Atoi(entryPort)
	return err == nil && n == port
}

func oracleURLPort(u *url.URL) int {
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return n
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// permits is the whole decision for a URL whose host is an address: the
// allow-list, then the dial check on that address (a name's addresses are
// only known at dial time, see the SSRF table test).
func permits(l *AllowList, nets []netip.Prefix, u *url.URL) bool {
	if l.CheckURL(u) != nil {
		return false
	}
	a, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return true
	}
	port, _ := urlPort(u)
	r := &netRules{nets: nets, list: l}
	return r.checkAddr(netip.AddrPortFrom(a, port)) == nil
}

func FuzzAllowList(f *testing.F) {
	for _, seed := range []struct{ entries, nets, url string }{
		{"allowed.example", "", "http://allowed.example/"},
		{"allowed.example", "", "https://ALLOWED.example.:443/x"},
		{"allowed.example:8080", "", "http://allowed.example:8080/"},
		{"allowed.example:*", "", "http://allowed.example:1/"},
		{"allowed.example", "", "http://allowed.example@127.0.0.1/"},
		{"allowed.example", "", "http://allowed.example.evil.example/"},
		{"127.0.0.1:*", "", "http://127.0.0.1:8080/"},
		{"127.0.0.1:*", "", "http://[::ffff:127.0.0.1]:8080/"},
		{"127.0.0.1:*", "", "http://[::ffff:7f00:1]/"},
		{"[::1]:*", "", "http://[::1]:9/"},
		{"[fe80::1]:*", "", "http://[fe80::1%25eth0]/"},
		{"localhost:*,127.0.0.1:*", "", "http://localhost:5/"},
		{"a.example", "127.0.0.0/8", "http://2130706433/"},
		{"a.example", "", "http://0x7f000001/"},
		{"a.example", "", "http://0177.0.0.1/"},
		{"a.example", "", "http://127.1/"},
		{"10.0.0.5", "10.0.0.0/8", "http://10.0.0.5/"},
		{"169.254.169.254", "", "http://169.254.169.254/latest/meta-data/"},
		{"[::ffff:10.0.0.5]:*", "::ffff:10.0.0.0/104", "http://10.0.0.5:1/"},
		{"bad/entry,::1,[x]", "nope", "ftp://x/"},
		// Templates: $ stands for the first entry's host.
		{"allowed.example", "", "http://$/"},
		{"Allowed.Example.:8080", "", "http://$:8080/"},
		{"127.0.0.1:*", "", "http://$:1/"},
		{"[::1]:443", "", "https://$/"},
		{"10.0.0.5", "10.0.0.0/8", "http://$"},
		{"allowed.example:*", "", "http://$@127.0.0.1:9/"},
		{"allowed.example:*", "", "http://$.evil.example/"},
		{"allowed.example:*", "", "http://evil.example#$"},
	} {
		f.Add(seed.entries, seed.nets, seed.url)
	}
	f.Fuzz(func(t *testing.T, entriesText, netsText, rawURL string) {
		entries := strings.Split(entriesText, ",")
		l, err := ParseAllowList(entries)
		if err != nil {
			return
		}
		_ = l.String()
		var netEntries []string
		if netsText != "" {
			netEntries = strings.Split(netsText, ",")
		}
		nets, err := ParseNets(netEntries)
		if err != nil {
			return
		}
		// $ in the URL stands for the first entry's host as written, so
		// that mutations explore URLs close to what the list allows.
		if h, _ := oracleEntry(entries[0]); strings.HasPrefix(strings.TrimSpace(entries[0]), "[") {
			rawURL = strings.ReplaceAll(rawURL, "$", "["+h+"]")
		} else {
			rawURL = strings.ReplaceAll(rawURL, "$", h)
		}
		u, err := url.Parse(rawURL)
		if err != nil {
			return
		}
		err = l.CheckURL(u)
		if err != nil {
			var r *RefusedError
			if !errors.As(err, &r) || r.Reason == "" {
				t.Fatalf("CheckURL(%q) = %v, want a *RefusedError with a reason", rawURL, err)
			}
		}
		if !permits(l, nets, u) {
			return
		}
		host := u.Hostname()
		ip := oracleIP(host)
		if ip == nil && oracleInetAton(host) {
			t.Fatalf("%q: host %q is an IPv4 address in disguise, yet allowed by %q", rawURL, host, entriesText)
		}
		// Some entry names this host and port.
		port := oracleURLPort(u)
		matched := slices.ContainsFunc(entries, func(e string) bool {
			eh, ep := oracleEntry(e)
			if !oraclePortAllowed(ep, port) {
				return false
			}
			if ip != nil {
				return net.ParseIP(eh).Equal(ip)
			}
			return strings.TrimSuffix(strings.ToLower(eh), ".") == strings.TrimSuffix(strings.ToLower(host), ".")
		})
		if !matched {
			t.Fatalf("%q allowed by %q though no entry names its host and port %d", rawURL, entriesText, port)
		}
		if ip == nil || !oracleSpecial(ip) {
			return
		}
		// A special address: an address entry (matched above) or a net
		// admits it; with neither, the request must have been refused.
		listed := slices.ContainsFunc(entries, func(e string) bool {
			eh, ep := oracleEntry(e)
			return net.ParseIP(eh).Equal(ip) && oraclePortAllowed(ep, port)
		})
		inNet := slices.ContainsFunc(netEntries, func(n string) bool {
			n = strings.TrimSpace(n)
			if _, cidr, err := net.ParseCIDR(n); err == nil {
				return cidr.Contains(ip)
			}
			return net.ParseIP(n).Equal(ip)
		})
		if !listed && !inNet {
			t.Fatalf("%q reaches special address %s with entries %q and nets %q", rawURL, ip, entriesText, netsText)
		}
	})
}

func FuzzAddressCheck(f *testing.F) {
	for _, seed := range []string{
		"127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "10.0.0.5", "172.16.0.1",
		"192.168.1.1", "fc00::1", "fd00:ec2::254", "169.254.169.254", "fe80::1", "fe80::1%eth0", "100.64.0.1",
		"0.0.0.0", "0.1.2.3", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "64:ff9b::7f00:1",
		"2002:7f00:1::", "::7f00:1", "8.8.8.8", "2001:4860:4860::8888", "1.1.1.1:80", "[::1]:80",
	} {
		f.Add([]byte(seed), uint16(80), "")
	}
	f.Add([]byte{127, 0, 0, 1}, uint16(8080), "127.0.0.0/8")
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 5}, uint16(443), "10.0.0.0/8")
	f.Add([]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(1), "fe80::/10,::ffff:0:0/96")
	f.Fuzz(func(t *testing.T, raw []byte, port uint16, netsText string) {
		// The dial hook sees an address text: whatever it is, it must not
		// panic, and what it cannot parse it refuses.
		if err := (&netRules{list: &AllowList{}}).control("tcp", string(raw), nil); err != nil {
			var r *RefusedError
			if !errors.As(err, &r) {
				t.Fatalf("control(%q) = %v, want a *RefusedError", raw, err)
			}
		} else if _, perr := netip.ParseAddrPort(string(raw)); perr != nil {
			t.Fatalf("control(%q) let an unparseable address through", raw)
		}

		a, ok := netip.AddrFromSlice(raw)
		if !ok {
			var err error
			if a, err = netip.ParseAddr(string(raw)); err != nil {
				return
			}
		}
		ip := net.IP(a.WithZone("").AsSlice())
		none := &netRules{list: &AllowList{}}
		err := none.checkAddr(netip.AddrPortFrom(a, port))
		if oracleSpecial(ip) && err == nil {
			t.Fatalf("%s (%v) is special, yet allowed with no nets", a, raw)
		}
		if err != nil {
			var r *RefusedError
			if !errors.As(err, &r) {
				t.Fatalf("checkAddr(%s) = %v, want a *RefusedError", a, err)
			}
			if !slices.Contains([]string{"loopback", "private", "link_local", "cgnat", "unspecified", "multicast", "reserved"}, r.Reason) {
				t.Fatalf("checkAddr(%s): unknown reason %q", a, r.Reason)
			}
			if !strings.Contains(r.Error(), a.Unmap().WithZone("").String()) {
				t.Fatalf("checkAddr(%s) = %q, which does not name the address", a, r.Error())
			}
		}
		// The IPv4-mapped IPv6 form of an address is judged as the address.
		if a.Is4() {
			mapped := none.checkAddr(netip.AddrPortFrom(netip.AddrFrom16(a.As16()), port))
			if (mapped == nil) != (err == nil) {
				t.Fatalf("%s allowed=%v but its mapped form allowed=%v", a, err == nil, mapped == nil)
			}
		}
		if err == nil || port == 0 {
			return
		}
		// A net holding the address, or the address listed with its port,
		// admits it.
		bare := a.Unmap().WithZone("")
		inNet := &netRules{nets: []netip.Prefix{netip.PrefixFrom(bare, bare.BitLen())}, list: &AllowList{}}
		if err := inNet.checkAddr(netip.AddrPortFrom(a, port)); err != nil {
			t.Fatalf("%s refused although its own net is allowed: %v", a, err)
		}
		entry := bare.String() + ":" + strconv.Itoa(int(port))
		if bare.Is6() {
			entry = "[" + bare.String() + "]:" + strconv.Itoa(int(port))
		}
		l, lerr := ParseAllowList([]string{entry})
		if lerr != nil {
			t.Fatalf("entry %q for %s does not parse: %v", entry, a, lerr)
		}
		if err := (&netRules{list: l}).checkAddr(netip.AddrPortFrom(a, port)); err != nil {
			t.Fatalf("%s refused although %q is listed: %v", a, entry, err)
		}
		// Fuzzed nets: a special address is admitted only by a net that
		// holds it.
		if netsText == "" {
			return
		}
		netEntries := strings.Split(netsText, ",")
		nets, nerr := ParseNets(netEntries)
		if nerr != nil {
			return
		}
		if (&netRules{nets: nets, list: &AllowList{}}).checkAddr(netip.AddrPortFrom(a, port)) != nil {
			return
		}
		if !slices.ContainsFunc(netEntries, func(n string) bool {
			n = strings.TrimSpace(n)
			if _, cidr, err := net.ParseCIDR(n); err == nil {
				return cidr.Contains(ip)
			}
			return net.ParseIP(n).Equal(ip)
		}) {
			t.Fatalf("%s admitted by nets %q, none of which holds it", a, netsText)
		}
	})
}
