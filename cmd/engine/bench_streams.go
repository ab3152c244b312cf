package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/migrations"
	"github.com/reveille/reveille/streams"
)

func init() { benches["streams"] = benchStreams }

// streamBench is one run's parameters.
type streamBench struct {
	writers, chunks, size, batch, rounds int
}

// benchStreams appends chunks through the Go API, one stream per writer,
// while one SSE reader per stream follows it over HTTP, and reports the
// append rate and the tail latency (append commit → SSE receipt), twice:
// appending through the streams service that serves the readers (one
// replica: its tails get the chunks without a table read), and through a
// second service on the same database (another replica: every chunk reaches
// the readers through NOTIFY and a read). Then the same rows through plain
// INSERTs on the same Postgres, for comparison. The commit instant is when
// the appending statement's result came back (a pgx tracer stamps it),
// before the notification is sent.
func benchStreams(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench streams", flag.ContinueOnError)
	var b streamBench
	fs.IntVar(&b.writers, "writers", 8, "concurrent writers, each to its own stream")
	fs.IntVar(&b.chunks, "chunks", 20000, "chunks to append in all")
	fs.IntVar(&b.size, "size", 256, "bytes per chunk")
	fs.IntVar(&b.batch, "batch", 50, "chunks per append (1: one chunk per transaction)")
	fs.IntVar(&b.rounds, "rounds", 3, "alternating rounds of both runs; medians are reported")
	dataDir := fs.String("data-dir", "", "where to start a local Postgres when DATABASE_URL is unset (default: a temporary directory)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measured rounds to this file")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: engine bench streams [flags]\n\nUses DATABASE_URL, or else starts a local Postgres (durable settings).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if b.writers < 1 || b.chunks < b.writers || b.size < 1 || b.batch < 1 || b.rounds < 1 {
		return errors.New("need writers ≥ 1, chunks ≥ writers, size ≥ 1, batch ≥ 1, rounds ≥ 1")
	}
	db, stop, err := benchDatabase(ctx, *dataDir, func(c *pgxpool.Config) {
		c.MaxConns = 40
		c.ConnConfig.Tracer = commitStamper{}
	})
	if err != nil {
		return err
	}
	defer stop()
	if _, err := migrations.UpPool(ctx, db, nil); err != nil {
		return err
	}

	env, err := b.setUp(ctx, db)
	if err != nil {
		return err
	}
	defer env.tearDown()
	// Warm up (connections, prepared statements, stream rows), then
	// alternate the two runs and report the medians: the machine is shared
	// and noisy.
	warm := b
	warm.chunks = max(b.writers, b.chunks/10)
	for i, w := range []*streams.Service{env.reader, env.writer} {
		if _, err := warm.measure(ctx, env, w, fmt.Sprint("bench-warm-up-", i)); err != nil {
			return err
		}
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	var local, remote []streamResult
	var baselines []float64
	for round := range b.rounds {
		l, err := b.measure(ctx, env, env.reader, fmt.Sprintf("bench-%d-local", round))
		if err != nil {
			return err
		}
		r, err := b.measure(ctx, env, env.writer, fmt.Sprintf("bench-%d-remote", round))
		if err != nil {
			return err
		}
		base, err := b.runBaseline(ctx, db)
		if err != nil {
			return err
		}
		fmt.Printf("round %d: one replica %s; two replicas %s; plain INSERT=%.0f rows/s\n", round+1, l, r, base)
		local, remote, baselines = append(local, l), append(remote, r), append(baselines, base)
	}
	fmt.Printf("streams: %s (median of %d; writers=%d chunks=%d size=%d batch=%d; writers and SSE readers on one replica)\n",
		medianResult(local), b.rounds, b.writers, b.chunks, b.size, b.batch)
	fmt.Printf("streams: %s (median; the same, the writers on a second replica: NOTIFY, then a table read)\n", medianResult(remote))
	fmt.Printf("baseline: plain INSERT=%.0f rows/s (median; same writers, rows and batches; no counter, no notify)\n", median(baselines))
	return nil
}

func (r streamResult) String() string {
	return fmt.Sprintf("appended=%.0f chunks/s tail_p50=%.2fms tail_p99=%.2fms", r.rate, ms(r.p50), ms(r.p99))
}

// medianResult takes the median of each figure on its own.
func medianResult(rs []streamResult) streamResult {
	pick := func(f func(streamResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	return streamResult{
		rate: pick(func(r streamResult) float64 { return r.rate }),
		p50:  time.Duration(pick(func(r streamResult) float64 { return float64(r.p50) })),
		p99:  time.Duration(pick(func(r streamResult) float64 { return float64(r.p99) })),
	}
}

func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type streamResult struct {
	rate     float64
	p50, p99 time.Duration
}

// benchEnv is the streams service behind an API server (the readers'
// replica), a second service on the same database (another replica's, for
// writers), and an agent token of a fresh org whose data is deleted at the
// end.
type benchEnv struct {
	reader, writer *streams.Service
	db             *pgxpool.Pool
	base           string
	org, tok       string
	tearDown       func()
}

func (b streamBench) setUp(ctx context.Context, db *pgxpool.Pool) (*benchEnv, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reader, err := streams.New(db, streams.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	// Appending needs no hub: the writers' replica is never started.
	writer, err := streams.New(db, streams.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := reader.Start(ctx); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	srv, err := api.New(ctx, api.Config{Auth: api.AuthConfig{Secrets: [][]byte{secret}}, Logger: quiet, Registry: prometheus.NewRegistry()},
		api.Services{DB: db, Streams: reader})
	if err != nil {
		_ = reader.Stop(context.Background())
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = reader.Stop(context.Background())
		return nil, err
	}
	sctx, stopServer := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()

	env := &benchEnv{reader: reader, writer: writer, db: db, base: "http://" + ln.Addr().String(), org: "bench-" + uuid.NewString()}
	env.tearDown = func() {
		stopServer()
		<-served
		_ = reader.Stop(context.Background())
		env.deleteOrg()
	}
	env.tok, err = api.SignToken(secret, api.TokenSpec{OrgID: env.org, Sub: "bench", Roles: []string{api.RoleAgent}, TTL: time.Hour})
	if err != nil {
		env.tearDown()
		return nil, err
	}
	return env, nil
}

// commitStamper stamps, into the *time.Time a context carries, the end of
// the first statement run with it: for an append, the moment its commit
// was acknowledged.
type commitStamper struct{}

type stampKey struct{}

func (commitStamper) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (commitStamper) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if at, ok := ctx.Value(stampKey{}).(*time.Time); ok && at.IsZero() && data.Err == nil {
		*at = time.Now()
	}
}

// deleteOrg removes the bench org's streams and chunks.
func (e *benchEnv) deleteOrg() {
	ctx := context.Background()
	_, _ = e.db.Exec(ctx, `DELETE FROM stream_chunks WHERE org_id = $1`, e.org)
	_, _ = e.db.Exec(ctx, `DELETE FROM streams WHERE org_id = $1`, e.org)
}

// measure appends b.chunks through svc to b.writers streams of run runID,
// one writer each, while an SSE reader per stream follows it.
func (b streamBench) measure(ctx context.Context, env *benchEnv, svc *streams.Service, runID string) (streamResult, error) {
	per := b.perWriter()
	commits, receipts := make([][]time.Time, b.writers), make([][]time.Time, b.writers)
	readers := make([]*http.Response, b.writers)
	defer func() {
		for _, r := range readers {
			if r != nil {
				r.Body.Close()
			}
		}
	}()
	for w := range b.writers {
		batches := (per[w] + b.batch - 1) / b.batch
		commits[w], receipts[w] = make([]time.Time, batches), make([]time.Time, batches)
		// The response arrives once the reader is subscribed.
		resp, err := openBenchSSE(ctx, env.base+"/v1/runs/"+runID+"/streams/"+strconv.Itoa(w)+"/sse", env.tok)
		if err != nil {
			return streamResult{}, err
		}
		readers[w] = resp
	}
	var readersDone errgroup.Group
	for w := range b.writers {
		readersDone.Go(func() error { return b.follow(readers[w].Body, per[w], receipts[w]) })
	}

	chunk := make([]byte, b.size)
	_, _ = rand.Read(chunk)
	start := time.Now()
	var writersDone errgroup.Group
	for w := range b.writers {
		writersDone.Go(func() error {
			name := strconv.Itoa(w)
			for i := range commits[w] {
				n := min(b.batch, per[w]-i*b.batch)
				actx := context.WithValue(ctx, stampKey{}, &commits[w][i])
				if _, err := svc.Append(actx, env.org, runID, name, slices.Repeat([][]byte{chunk}, n)); err != nil {
					return err
				}
			}
			return svc.Close(ctx, env.org, runID, name)
		})
	}
	if err := writersDone.Wait(); err != nil {
		return streamResult{}, err
	}
	elapsed := time.Since(start)
	if err := readersDone.Wait(); err != nil {
		return streamResult{}, err
	}
	var lat []time.Duration
	for w := range b.writers {
		for i, c := range commits[w] {
			lat = append(lat, max(0, receipts[w][i].Sub(c)))
		}
	}
	slices.Sort(lat)
	return streamResult{
		rate: float64(b.chunks) / elapsed.Seconds(),
		p50:  lat[len(lat)/2], p99: lat[min(len(lat)-1, len(lat)*99/100)],
	}, nil
}

// perWriter splits the chunks between the writers.
func (b streamBench) perWriter() []int {
	per := make([]int, b.writers)
	for w := range per {
		per[w] = b.chunks / b.writers
		if w < b.chunks%b.writers {
			per[w]++
		}
	}
	return per
}

func openBenchSSE(ctx context.Context, url, tok string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("SSE: %s", resp.Status)
	}
	return resp, nil
}

// follow reads one stream's events until `end`, stamping the receipt of
// each batch's last chunk.
func (b streamBench) follow(body io.Reader, total int, receipts []time.Time) error {
	r := bufio.NewReaderSize(body, 1<<16)
	seen := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("SSE ended after %d of %d chunks: %w", seen, total, err)
		}
		switch {
		case strings.HasPrefix(line, "event: end"):
			if seen != total {
				return fmt.Errorf("SSE ended after %d of %d chunks", seen, total)
			}
			return nil
		case strings.HasPrefix(line, "id: "):
			idx, err := strconv.Atoi(strings.TrimSpace(line[4:]))
			if err != nil || idx != seen {
				return fmt.Errorf("SSE: event id %q, want %d", line, seen)
			}
			seen++
			if seen%b.batch == 0 || seen == total {
				receipts[(seen-1)/b.batch] = time.Now()
			}
		}
	}
}

// runBaseline inserts the same rows, batched the same way, with plain
// INSERTs into a table of the chunks' shape: the cost floor of storing them.
func (b streamBench) runBaseline(ctx context.Context, db *pgxpool.Pool) (float64, error) {
	table := "bench_insert_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := db.Exec(ctx, `CREATE TABLE `+table+` (stream_id uuid NOT NULL, chunk_index bigint NOT NULL, org_id text NOT NULL, data bytea NOT NULL, PRIMARY KEY (stream_id, chunk_index))`); err != nil {
		return 0, fmt.Errorf("baseline table: %w", err)
	}
	defer func() { _, _ = db.Exec(context.Background(), `DROP TABLE `+table) }()
	chunk := make([]byte, b.size)
	_, _ = rand.Read(chunk)
	per := b.perWriter()
	start := time.Now()
	var g errgroup.Group
	for w := range b.writers {
		g.Go(func() error {
			id := uuid.New()
			for i := 0; i < per[w]; i += b.batch {
				n := min(b.batch, per[w]-i)
				_, err := db.Exec(ctx, `INSERT INTO `+table+` (stream_id, chunk_index, org_id, data)
					SELECT $1, $2 + t.ord - 1, 'bench', t.data FROM unnest($3::bytea[]) WITH ORDINALITY AS t(data, ord)`,
					id, i, slices.Repeat([][]byte{chunk}, n))
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return float64(b.chunks) / time.Since(start).Seconds(), nil
}
