package workpool

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults (SPEC §3).
const (
	DefaultPools             = "default=25,wakeup=25"
	DefaultRecoveryPeriod    = 10 * time.Second
	DefaultHeartbeatTimeout  = 30 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultWorkRetention     = 24 * time.Hour
	DefaultTimeoutMS         = 600_000
	DefaultCooldown          = 2 * time.Second
	DefaultLeaderRetry       = 2 * time.Second
	DefaultStopGrace         = 10 * time.Second
	DefaultHookTimeout       = 10 * time.Second
	DefaultStatementTimeout  = 30 * time.Second
	DefaultMaxWorkers        = 10_000

	// MaxHookTimeout bounds HookTimeout: a hook runs in the transaction that
	// records its completion, with every other completion of the batch
	// waiting, and Postgres takes no statement timeout past ~24 days.
	MaxHookTimeout = time.Hour

	// DefaultMaxPendingPerOrg caps an org's unfinished work in one pool.
	DefaultMaxPendingPerOrg = 100_000
	// NoPendingLimit as Config.MaxPendingPerOrg turns the cap off.
	NoPendingLimit = -1

	// IdempotencyRetention is the least time an enqueue's idempotency key
	// is kept (longer when REVEILLE_WORK_RETENTION is longer, so that a
	// repeat finds the work while its record exists).
	IdempotencyRetention = 24 * time.Hour

	// MaxParallelismLimit bounds a pool's max_parallelism.
	MaxParallelismLimit = 10_000
	// maxArgsBytes bounds a work item's args (and a handler's result).
	maxArgsBytes = 1 << 20
	// MaxResultBytes bounds the JSON a handler returns: a longer result
	// fails its attempt for good ("handler result exceeds 1048576 bytes").
	MaxResultBytes = maxArgsBytes
	// MaxTimeoutMS bounds a work item's timeout_ms (24 h).
	MaxTimeoutMS = 24 * 3600 * 1000
)

// Config configures a Manager. Zero values take the defaults noted.
type Config struct {
	// Pools are created at start when missing, with these max_parallelism
	// values; existing pools keep their settings (REVEILLE_POOLS, default
	// "default=25,wakeup=25"). A nil map means the default; an empty one
	// creates nothing.
	Pools map[string]int
	// RecoveryPeriod is how often a pool's loop looks for running work
	// whose executor stopped heartbeating, and retries failed hook calls
	// (REVEILLE_RECOVERY_PERIOD, default 10 s).
	RecoveryPeriod time.Duration
	// HeartbeatTimeout is how old a running item's heartbeat may get before
	// the attempt counts as failed (REVEILLE_HEARTBEAT_TIMEOUT, default 30 s).
	HeartbeatTimeout time.Duration
	// HeartbeatInterval is how often executors heartbeat their work
	// (default 5 s). Keep it well under HeartbeatTimeout.
	HeartbeatInterval time.Duration
	// WorkRetention is how long finished work stays readable
	// (REVEILLE_WORK_RETENTION, default 24 h).
	WorkRetention time.Duration
	// Cooldown is how long an idle loop keeps reporting "running" after its
	// last work (default 2 s).
	Cooldown time.Duration
	// LeaderRetry is how often a standby replica tries to take over a pool's
	// loop, and how often the leader checks its lock connection (default 2 s).
	LeaderRetry time.Duration
	// StopGrace is how long Stop lets running handlers finish before it
	// cancels them (default 10 s; Stop's context can cut it shorter).
	StopGrace time.Duration
	// HookRetryBackoff is the wait before the first retry of a failed
	// onComplete hook call; it doubles per failure up to 5 minutes
	// (default 1 s).
	HookRetryBackoff time.Duration
	// HookTimeout bounds one onComplete hook call: each statement it runs
	// (a statement timeout on the transaction the hooks run in) and the
	// call's context, a second longer (default 10 s; a statement begun
	// before the context ends runs to its end). A call past it fails and is
	// retried like any failed hook call, so that a hook stuck on a lock
	// cannot hold up every completion this replica records.
	HookTimeout time.Duration
	// StatementTimeout bounds the pool's own statements that wait on no
	// other transaction's row locks — a claim, a start, a loop iteration's
	// first round trips and its commit, the loop's read and saves of the
	// fair-share turns and its chores' reads (default 30 s): behind a
	// proxy that stopped answering one would wait for good, holding up
	// every result this replica records or every start of the pool while
	// this replica keeps its leadership. (A connection the network dropped
	// is ended by the dialer's TCP bounds: db.Dial, which the service's
	// pool uses; give a pool of your own the same.) A record with hooks
	// and the rest of an iteration are not bounded as a whole, their hook
	// calls may take long: each of their round trips that waits on no row
	// lock is, by StatementTimeout + HookTimeout (the server ends a hook's
	// statement at HookTimeout). The recording of results (with hooks or
	// without), the marking of work canceled and a term's takeover are not
	// bounded: they may wait on rows a record or an iteration holds through
	// its hook calls.
	StatementTimeout time.Duration
	// MaxWorkers bounds the handlers this replica runs at once, across
	// pools (default 10,000).
	MaxWorkers int
	// MaxPendingPerOrg caps the unfinished work (pending, retries
	// included, or running) one org may have in one pool: an enqueue past it is
	// ErrTooManyPending (REVEILLE_ORG_MAX_PENDING, default 100,000;
	// NoPendingLimit turns it off, as REVEILLE_ORG_MAX_PENDING=0 does).
	MaxPendingPerOrg int
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default: none registered).
	Registry prometheus.Registerer
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Pools == nil {
		c.Pools, _ = ParsePools(DefaultPools)
	}
	c.RecoveryPeriod = cmp.Or(c.RecoveryPeriod, DefaultRecoveryPeriod)
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, DefaultHeartbeatTimeout)
	if c.HeartbeatInterval == 0 {
		// A short timeout (tests) needs a heartbeat well within it.
		c.HeartbeatInterval = min(DefaultHeartbeatInterval, c.HeartbeatTimeout/3)
	}
	c.WorkRetention = cmp.Or(c.WorkRetention, DefaultWorkRetention)
	c.Cooldown = cmp.Or(c.Cooldown, DefaultCooldown)
	c.LeaderRetry = cmp.Or(c.LeaderRetry, DefaultLeaderRetry)
	c.StopGrace = cmp.Or(c.StopGrace, DefaultStopGrace)
	c.MaxWorkers = cmp.Or(c.MaxWorkers, DefaultMaxWorkers)
	c.MaxPendingPerOrg = cmp.Or(c.MaxPendingPerOrg, DefaultMaxPendingPerOrg)
	c.HookRetryBackoff = cmp.Or(c.HookRetryBackoff, time.Second)
	c.HookTimeout = cmp.Or(c.HookTimeout, DefaultHookTimeout)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, DefaultStatementTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	for name, n := range c.Pools {
		if err := validPoolName(name); err != nil {
			return err
		}
		if n < 1 || n > MaxParallelismLimit {
			return fmt.Errorf("pool %q: max_parallelism %d out of range 1–%d", name, n, MaxParallelismLimit)
		}
	}
	switch {
	case c.RecoveryPeriod < 0, c.HeartbeatTimeout < 0, c.HeartbeatInterval < 0, c.WorkRetention < 0,
		c.Cooldown < 0, c.LeaderRetry < 0, c.StopGrace < 0, c.HookRetryBackoff < 0, c.HookTimeout < 0, c.StatementTimeout < 0:
		return errors.New("workpool: durations must not be negative")
	case c.HookTimeout > MaxHookTimeout:
		return fmt.Errorf("workpool: hook timeout %s exceeds %s: a hook call holds up the completions recorded with it", c.HookTimeout, MaxHookTimeout)
	case c.HeartbeatInterval >= c.HeartbeatTimeout:
		return fmt.Errorf("workpool: heartbeat interval %s must be shorter than the heartbeat timeout %s", c.HeartbeatInterval, c.HeartbeatTimeout)
	case c.MaxWorkers < 0:
		return errors.New("workpool: MaxWorkers must not be negative")
	case c.MaxPendingPerOrg < NoPendingLimit:
		return errors.New("workpool: MaxPendingPerOrg must be positive, or NoPendingLimit")
	}
	return nil
}

var poolNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func validPoolName(name string) error {
	if !poolNameRE.MatchString(name) {
		return fmt.Errorf("pool name %q: use 1–63 of a-z, 0-9, _ . - starting with a letter or digit", name)
	}
	return nil
}

// ParsePools parses REVEILLE_POOLS: "default=25,wakeup=25".
func ParsePools(s string) (map[string]int, error) {
	pools := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, num, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok {
			return nil, fmt.Errorf("pools %q: %q is not name=max_parallelism", s, part)
		}
		if err := validPoolName(name); err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(strings.TrimSpace(num))
		if err != nil || n < 1 || n > MaxParallelismLimit {
			return nil, fmt.Errorf("pools %q: max_parallelism of %s must be an integer in 1–%d", s, name, MaxParallelismLimit)
		}
		if _, dup := pools[name]; dup {
			return nil, fmt.Errorf("pools %q: %s given twice", s, name)
		}
		pools[name] = n
	}
	return pools, nil
}

// sortedPools lists pool names in a stable order.
func sortedPools(p map[string]int) []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
