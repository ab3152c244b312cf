package streams

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Service. Zero values take the defaults noted.
type Config struct {
	// MaxChunk is the largest chunk in bytes (default 1 MiB;
	// REVEILLE_STREAM_MAX_CHUNK).
	MaxChunk int64
	// MaxRequest is the largest append request body in bytes (default 8 MiB;
	// REVEILLE_STREAM_MAX_REQUEST). It also bounds the bytes one page or one
	// live-tail read holds in memory.
	MaxRequest int64
	// MaxChunksPerRequest is the most chunks one append may hold (default
	// 1000; REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST): each is a row, and one
	// append is one transaction.
	MaxChunksPerRequest int
	// Retention is how long a closed stream is kept before it is purged
	// (default 7 days; REVEILLE_STREAM_RETENTION).
	Retention time.Duration
	// KeepAlive is the interval of SSE keep-alive comments (default 15 s).
	KeepAlive time.Duration
	// PurgeInterval is how often the retention leader looks for expired
	// streams (default 1 min).
	PurgeInterval time.Duration
	// PurgeBatch bounds the streams, and the chunks, one purge statement
	// deletes (default 1000).
	PurgeBatch int
	// LeaderRetry is how often a standby replica tries to take over the
	// retention leadership (default 2 s).
	LeaderRetry time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default: not registered).
	Registry prometheus.Registerer
}

// Defaults of Config.
const (
	DefaultMaxChunk      = 1 << 20
	DefaultMaxRequest    = 8 << 20
	DefaultMaxChunks     = 1000
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultKeepAlive     = 15 * time.Second
	DefaultPurgeInterval = time.Minute
	DefaultPurgeBatch    = 1000
)

// MaxChunkLimit is the largest MaxChunk may be: a chunk goes to a live
// reader as one SSE data line of base64 (4/3 of its size), and the Go
// client (client.Streams.Tail) reads lines of up to 32 MiB. A chunk the
// server accepted past that, Chunks could read and Tail never.
const MaxChunkLimit = 16 << 20

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.MaxChunk = cmp.Or(c.MaxChunk, DefaultMaxChunk)
	c.MaxRequest = cmp.Or(c.MaxRequest, DefaultMaxRequest)
	c.MaxChunksPerRequest = cmp.Or(c.MaxChunksPerRequest, DefaultMaxChunks)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.KeepAlive = cmp.Or(c.KeepAlive, DefaultKeepAlive)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, DefaultPurgeInterval)
	c.PurgeBatch = cmp.Or(c.PurgeBatch, DefaultPurgeBatch)
	c.LeaderRetry = cmp.Or(c.LeaderRetry, 2*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.MaxChunk < 0 || c.MaxRequest < 0 || c.MaxChunksPerRequest < 0 || c.Retention < 0 || c.KeepAlive < 0 || c.PurgeInterval < 0 || c.PurgeBatch < 0 || c.LeaderRetry < 0 {
		errs = append(errs, errors.New("limits and durations must not be negative"))
	}
	if c.MaxChunk > MaxChunkLimit {
		errs = append(errs, fmt.Errorf("MaxChunk (%d) exceeds %d (16 MiB): a live reader gets a chunk as one line of base64", c.MaxChunk, MaxChunkLimit))
	}
	if c.MaxChunk > c.MaxRequest && c.MaxRequest > 0 {
		errs = append(errs, fmt.Errorf("MaxChunk (%d) exceeds MaxRequest (%d)", c.MaxChunk, c.MaxRequest))
	}
	return errors.Join(errs...)
}
