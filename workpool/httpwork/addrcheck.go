package httpwork

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// specialNet is a range of addresses a request must not reach unless
// REVEILLE_HTTP_ALLOWED_NETS covers it: the service's own host, its private
// network, the cloud metadata endpoint and the like.
type specialNet struct {
	prefix netip.Prefix
	reason string // metric label
	what   string // "10.0.0.5 is <what>"
}

var specialNets = func() []specialNet {
	var out []specialNet
	add := func(reason, what string, cidrs ...string) {
		for _, c := range cidrs {
			out = append(out, specialNet{netip.MustParsePrefix(c), reason, what})
		}
	}
	// More specific ranges first: the first match names the reason.
	add("link_local", "a link-local address (the cloud metadata endpoint)", "169.254.169.254/32")
	add("unspecified", "an unspecified address", "0.0.0.0/8", "::/128")
	add("loopback", "a loopback address", "127.0.0.0/8", "::1/128")
	add("private", "a private address", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10")
	add("link_local", "a link-local address", "169.254.0.0/16", "fe80::/10")
	add("cgnat", "a carrier-grade NAT address", "100.64.0.0/10")
	add("multicast", "a multicast address", "224.0.0.0/4", "ff00::/8")
	add("reserved", "a reserved address", "240.0.0.0/4", "::/96", "64:ff9b:1::/48")
	return out
}()

// refusalReasons are the reason labels of refusals: the allow-list's
// (host, port, url) and each special range's.
func refusalReasons() []string {
	reasons := []string{"host", "port", "url"}
	for _, s := range specialNets {
		if !slices.Contains(reasons, s.reason) {
			reasons = append(reasons, s.reason)
		}
	}
	return reasons
}

// embedsIPv4 are IPv6 ranges that carry an IPv4 address in their low 32 bits
// (NAT64) or bits 16-48 (6to4) and route to it: they are judged by that
// IPv4 address, so [64:ff9b::a00:5] is as private as 10.0.0.5.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// classify returns the special range a is in (a unmapped, without zone), or
// false for an ordinary public address.
func classify(a netip.Addr) (specialNet, bool) {
	if v4, ok := embeddedIPv4(a); ok {
		if s, ok := classify(v4); ok {
			return s, true
		}
	}
	for _, s := range specialNets {
		if s.prefix.Contains(a) {
			return s, true
		}
	}
	return specialNet{}, false
}

func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// ParseNets parses REVEILLE_HTTP_ALLOWED_NETS: CIDRs (or single addresses)
// whose addresses the dial check lets through although they are loopback,
// private, link-local and so on.
func ParseNets(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, raw := range entries {
		s := strings.TrimSpace(raw)
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				errs = append(errs, fmt.Errorf("REVEILLE_HTTP_ALLOWED_NETS entry %q: want a CIDR such as 10.0.0.0/8", raw))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, unmapPrefix(p.Masked()))
	}
	return out, errors.Join(errs...)
}

// unmapPrefix turns ::ffff:10.0.0.0/104 into 10.0.0.0/8, as addresses are
// unmapped before they are checked.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// netRules decide, at connect time, which addresses a request may reach.
type netRules struct {
	nets []netip.Prefix
	list *AllowList
}

// checkAddr returns a *RefusedError if ap is in a special range that neither
// REVEILLE_HTTP_ALLOWED_NETS nor an address entry of the allow-list admits.
func (r *netRules) checkAddr(ap netip.AddrPort) error {
	if refusal := r.refusal(ap); refusal != nil {
		return refusal
	}
	return nil
}

func (r *netRules) refusal(ap netip.AddrPort) *RefusedError {
	a := ap.Addr().Unmap().WithZone("")
	s, special := classify(a)
	if !special {
		return nil
	}
	for _, p := range r.nets {
		if p.Contains(a) {
			return nil
		}
	}
	if r.list != nil && r.list.allowsAddr(a, ap.Port()) {
		return nil
	}
	return refused(s.reason, "%s is %s; allow it with REVEILLE_HTTP_ALLOWED_NETS", a, s.what)
}

// control is the dialer's Control hook: it sees the address the socket is
// about to connect to, after every name resolution, so no DNS answer
// (rebinding included) can steer a request past the rules.
func (r *netRules) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return refused("url", "cannot check the address %q: %v", address, err)
	}
	return r.checkAddr(ap)
}

// LookupFunc resolves a host name to its addresses.
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

func systemLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// guardedDialer resolves the host itself and dials each address in turn
// through a dialer whose Control hook applies the rules; a refused address
// is skipped, so a name with both a loopback and a public address reaches
// the public one.
type guardedDialer struct {
	rules  *netRules
	lookup LookupFunc
	dialer *net.Dialer
}

func (d *guardedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", portText, err)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = d.lookup(ctx, host); err != nil {
		return nil, fmt.Errorf("resolving %s: %w", host, err)
	} else if len(addrs) == 0 {
		return nil, fmt.Errorf("resolving %s: no addresses", host)
	}
	var firstRefusal *RefusedError
	var lastErr error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port))
		// Checked here too so a refusal does not depend on whether the
		// machine could open a socket of the address's family; Control
		// then checks what is actually connected to.
		if r := d.rules.refusal(ap); r != nil {
			firstRefusal = cmp.Or(firstRefusal, r)
			continue
		}
		conn, err := d.dialer.DialContext(ctx, network, ap.String())
		if err == nil {
			return conn, nil
		}
		var r *RefusedError
		if errors.As(err, &r) {
			if firstRefusal == nil {
				firstRefusal = r
			}
			continue
		}
		lastErr = err
	}
	// A network error on an allowed address may pass (retryable); only when
	// every address is refused is the request refused.
	if lastErr != nil {
		return nil, lastErr
	}
	return nil, firstRefusal
}
