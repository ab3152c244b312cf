package httpwork

import (
	"net/url"
)

// URLRules check a URL against the handler's network rules before any
// request is made — a webhook's URL when it is registered — as far as they
// can be decided without resolving the host: a name's addresses are
// checked only when a request connects (the dial check).
type URLRules struct {
	list *AllowList
}

// NewURLRules parses the allow-list of cfg, or returns an error naming
// every invalid entry, as New does.
func NewURLRules(cfg Config) (*URLRules, error) {
	list, err := ParseAllowList(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	return &URLRules{list: list}, nil
}

// CheckURL returns a *RefusedError when the handler would refuse a request
// to u whatever DNS answers: not an http(s) URL, or a host or port outside
// REVEILLE_HTTP_ALLOWED_HOSTS. An address literal (10.0.0.5, [::1]) passes
// only through an address entry of its own, which also admits its address
// class at connect time, so the allow-list decides it entirely.
func (r *URLRules) CheckURL(u *url.URL) error {
	if refusal := r.list.check(u); refusal != nil {
		return refusal
	}
	return nil
}
