package httpwork

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// RefusedError is a request the network rules forbid. It is final: the same
// request would be refused again, so the work fails without retries.
type RefusedError struct {
	// Reason is a short, bounded label (the refusal metric's label): host,
	// port, url, or the address class (loopback, private, link_local, cgnat,
	// unspecified, multicast, reserved).
	Reason string
	msg    string
}

func (e *RefusedError) Error() string { return e.msg }

func refused(reason, format string, args ...any) *RefusedError {
	return &RefusedError{Reason: reason, msg: "http: " + fmt.Sprintf(format, args...)}
}

// portRule is which ports an allow-list entry admits.
type portRule uint8

const (
	portsDefault portRule = iota // 80 and 443, for an entry written without a port
	portsOne                     // the entry's port
	portsAny                     // host:*
)

// allowEntry is one parsed REVEILLE_HTTP_ALLOWED_HOSTS entry: a host name or
// an IP address, and its ports.
type allowEntry struct {
	name  string     // lower case, no trailing dot; "" for an address entry
	addr  netip.Addr // unmapped, no zone; invalid for a name entry
	rule  portRule
	port  uint16
	entry string // as configured, for error messages
}

func (e allowEntry) allowsPort(p uint16) bool {
	switch e.rule {
	case portsAny:
		return true
	case portsOne:
		return p == e.port
	default:
		return p == 80 || p == 443
	}
}

// AllowList is the parsed REVEILLE_HTTP_ALLOWED_HOSTS: which hosts and ports
// requests and redirects may go to. An IP address in it also lifts the
// address-class refusal of the dial check for that address and its ports.
type AllowList struct {
	entries []allowEntry
}

// ParseAllowList parses allow-list entries: `host` (ports 80 and 443),
// `host:port` or `host:*` (any port); an IPv6 address is written in
// brackets (`[::1]:*`). Host names match case-insensitively, a trailing dot
// ignored. Every invalid entry is reported; no entry is silently dropped.
func ParseAllowList(entries []string) (*AllowList, error) {
	l := &AllowList{}
	var errs []error
	for _, raw := range entries {
		e, err := parseEntry(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("REVEILLE_HTTP_ALLOWED_HOSTS entry %q: %w", raw, err))
			continue
		}
		l.entries = append(l.entries, e)
	}
	return l, errors.Join(errs...)
}

func parseEntry(raw string) (allowEntry, error) {
	s := strings.TrimSpace(raw)
	e := allowEntry{entry: s}
	if s == "" {
		return e, errors.New("empty entry")
	}
	if strings.ContainsAny(s, "/@?#") {
		return e, errors.New("want host, host:port or host:* (no scheme, user or path)")
	}
	var host, port string
	bracketed := strings.HasPrefix(s, "[")
	if bracketed {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return e, errors.New("unclosed [")
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return e, errors.New("want [address], [address]:port or [address]:*")
			}
			port = port[1:]
			if port == "" {
				return e, errors.New("empty port")
			}
		}
	} else {
		switch strings.Count(s, ":") {
		case 0:
			host = s
		case 1:
			host, port, _ = strings.Cut(s, ":")
			if port == "" {
				return e, errors.New("empty port")
			}
		default:
			return e, errors.New("write an IPv6 address in brackets, e.g. [::1]:*")
		}
	}
	if err := e.parsePort(port); err != nil {
		return e, err
	}
	if bracketed {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return e, errors.New("brackets must hold an IPv6 address without a zone")
		}
		e.addr = a.Unmap()
		return e, nil
	}
	host = normalName(host)
	if a, err := netip.ParseAddr(host); err == nil {
		e.addr = a
		return e, nil
	}
	if endsInNumber(host) {
		return e, errors.New("not a dotted-decimal IPv4 address (write e.g. 127.0.0.1)")
	}
	if !validName(host) {
		return e, errors.New("not a valid host name")
	}
	e.name = host
	return e, nil
}

func (e *allowEntry) parsePort(port string) error {
	switch port {
	case "":
		e.rule = portsDefault
	case "*":
		e.rule = portsAny
	default:
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("port %q: want 1-65535 or *", port)
		}
		e.rule, e.port = portsOne, uint16(n)
	}
	return nil
}

// normalName lower-cases a host name and drops one trailing dot, so that
// Example.COM. and example.com are the same host.
func normalName(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// endsInNumber reports whether a URL parser following the WHATWG URL
// standard (browsers, curl, many resolvers' inet_aton) would read host as an
// IPv4 address: its last label is a decimal or 0x-hex number. Such a host
// that is not dotted decimal (2130706433, 0x7f000001, 0177.0.0.1, 127.1) is
// an address in disguise and never matches a name.
func endsInNumber(host string) bool {
	labels := strings.Split(host, ".")
	last := labels[len(labels)-1]
	if last == "" && len(labels) > 1 {
		last = labels[len(labels)-2]
	}
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") || strings.HasPrefix(last, "0X") {
		return strings.Trim(last[2:], "0123456789abcdefABCDEF") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

// validName reports whether h is a DNS host name: dot-separated labels of
// 1-63 letters, digits, hyphens or underscores, at most 253 bytes.
func validName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// CheckURL returns a *RefusedError unless u is an http(s) URL whose host and
// port an entry allows. An IP-address host matches an address entry of the
// same address in any notation (127.0.0.1 and [::ffff:127.0.0.1] are one).
func (l *AllowList) CheckURL(u *url.URL) error {
	if r := l.check(u); r != nil {
		return r
	}
	return nil
}

func (l *AllowList) check(u *url.URL) *RefusedError { return l.checkShown(u, redacted(u)) }

// checkShown is check naming u as shownURL in its refusals (shown: the
// scheme and host alone when the path is a secret).
func (l *AllowList) checkShown(u *url.URL, shownURL string) *RefusedError {
	if u.Scheme != "http" && u.Scheme != "https" {
		return refused("url", "url %q: want an absolute http(s) URL", shownURL)
	}
	host := u.Hostname()
	if host == "" {
		return refused("url", "url %q has no host", shownURL)
	}
	port, ok := urlPort(u)
	if !ok {
		return refused("url", "url %q: port %q is not 1-65535", shownURL, u.Port())
	}
	hostPort := u.Host
	if u.Port() == "" {
		hostPort = u.Host + ":" + strconv.Itoa(int(port))
	}
	name := normalName(host)
	addr, err := netip.ParseAddr(host)
	isAddr := err == nil
	if isAddr {
		addr = addr.Unmap().WithZone("")
	}
	hostMatched := false
	for _, e := range l.entries {
		if isAddr && e.addr != addr || !isAddr && (e.name == "" || e.name != name) {
			continue
		}
		if e.allowsPort(port) {
			return nil
		}
		hostMatched = true
	}
	if hostMatched {
		return refused("port", "host %q is not in REVEILLE_HTTP_ALLOWED_HOSTS: port %d of %s is not allowed (entries: %s; an entry without a port allows ports 80 and 443)",
			hostPort, port, host, l.String())
	}
	if !isAddr && endsInNumber(name) {
		return refused("host", "host %q is an IPv4 address in a non-standard notation; only dotted decimal (e.g. 127.0.0.1) is matched against REVEILLE_HTTP_ALLOWED_HOSTS (entries: %s)",
			host, l.String())
	}
	return refused("host", "host %q is not in REVEILLE_HTTP_ALLOWED_HOSTS (entries: %s)", hostPort, l.String())
}

// urlPort is the port a request to u connects to: the explicit one or the
// scheme's default.
func urlPort(u *url.URL) (uint16, bool) {
	p := u.Port()
	if p == "" {
		if u.Scheme == "https" {
			return 443, true
		}
		return 80, true
	}
	n, err := strconv.ParseUint(p, 10, 16)
	return uint16(n), err == nil && n != 0
}

// allowsAddr reports whether an address entry admits a connection to a:port
// (a unmapped, without zone).
func (l *AllowList) allowsAddr(a netip.Addr, port uint16) bool {
	for _, e := range l.entries {
		if e.addr.IsValid() && e.addr == a && e.allowsPort(port) {
			return true
		}
	}
	return false
}

// String lists the entries as configured ("none" when empty), for error
// messages that tell the operator what to change.
func (l *AllowList) String() string {
	if len(l.entries) == 0 {
		return "none"
	}
	const show = 10
	parts := make([]string, 0, min(len(l.entries), show)+1)
	for i, e := range l.entries {
		if i == show {
			parts = append(parts, fmt.Sprintf("and %d more", len(l.entries)-show))
			break
		}
		parts = append(parts, e.entry)
	}
	return strings.Join(parts, ", ")
}
