package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/reveille/reveille/api"
	reveille "github.com/reveille/reveille/client"
	"github.com/reveille/reveille/internal/service"
	"github.com/reveille/reveille/streams"
)

// StreamsConfig is one `engine bench streams` run.
type StreamsConfig struct {
	// Service is the engine's configuration; the run replaces its database
	// and API.
	Service service.Config
	// Chunks chunks of Size bytes appended by Writers concurrent writers,
	// Batch per append, in Rounds alternating rounds.
	Writers, Chunks, Size, Batch, Rounds int
	// DataDir is where a local Postgres starts when Service has no
	// database (a temporary directory when empty).
	DataDir string
	// CPUProfile, when set, is the file the measured rounds' CPU profile
	// goes to.
	CPUProfile string
}

// streamBench is one run's parameters.
type streamBench struct {
	writers, chunks, size, batch, rounds int
}

// Streams appends chunks through the Go API, one stream per writer,
// while one SSE reader per stream follows it over HTTP, and reports the
// append rate and the tail latency (append commit → SSE receipt), twice:
// appending through the streams service that serves the readers (one
// replica: its tails get the chunks without a table read), and through a
// second service on the same database (another replica: every chunk reaches
// the readers through NOTIFY and a read). Then the same rows through plain
// INSERTs on the same Postgres, for comparison. The commit instant is when
// the appending statement's result came back (a pgx tracer stamps it),
// before the notification is sent.
func Streams(ctx context.Context, c StreamsConfig) error {
	b := streamBench{writers: c.Writers, chunks: c.Chunks, size: c.Size, batch: c.Batch, rounds: c.Rounds}
	if b.writers < 1 || b.chunks < b.writers || b.size < 1 || b.batch < 1 || b.rounds < 1 {
		return errors.New("need writers ≥ 1, chunks ≥ writers, size ≥ 1, batch ≥ 1, rounds ≥ 1")
	}
	// (refused before anything starts, not at the warm-up's first append)
	limits := c.Service.Streams.WithDefaults()
	switch {
	case b.batch > limits.MaxChunksPerRequest:
		return fmt.Errorf("need batch ≤ %d (REVEILLE_STREAM_MAX_CHUNKS_PER_REQUEST: the most chunks one append holds)", limits.MaxChunksPerRequest)
	case int64(b.size) > limits.MaxChunk:
		return fmt.Errorf("need size ≤ %d (REVEILLE_STREAM_MAX_CHUNK: the largest chunk)", limits.MaxChunk)
	case int64(b.size)*int64(b.batch) > limits.MaxRequest:
		return fmt.Errorf("need size × batch ≤ %d (REVEILLE_STREAM_MAX_REQUEST: the most bytes one append holds)", limits.MaxRequest)
	}
	w, err := setUp(ctx, c.Service, "streams", c.DataDir, false)
	defer w.tearDown(false)
	if err != nil {
		return err
	}
	env, err := b.setUp(ctx, c.Service, w)
	if err != nil {
		return err
	}
	defer env.tearDown()
	// Warm up (connections, prepared statements, stream rows), then
	// alternate the two runs and report the medians: the machine is shared
	// and noisy.
	warm := b
	warm.chunks = max(b.writers, b.chunks/10)
	for i, svc := range []*streams.Service{env.reader, env.writer} {
		if _, err := warm.measure(ctx, env, svc, fmt.Sprint("bench-warm-up-", i)); err != nil {
			return err
		}
	}
	stopProfile, err := startCPUProfile(c.CPUProfile)
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
		base, err := b.runBaseline(ctx, env.db)
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

// benchEnv is the engine serving the SSE readers (the readers' replica),
// a second engine on the same database that is built but never run
// (another replica's streams service, for writers: appending needs no
// hub), and an agent token.
type benchEnv struct {
	reader, writer *streams.Service
	db             *pgxpool.Pool
	base           string
	org, tok       string
	tearDown       func()
}

func (b streamBench) setUp(ctx context.Context, base service.Config, w *where) (*benchEnv, error) {
	cfg, secret := serviceConfig(base, w, quiet)
	cfg.ConfigureDB = func(c *pgxpool.Config) {
		c.MaxConns = 40
		c.ConnConfig.Tracer = commitStamper{}
	}
	readers, err := service.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	writers, err := service.New(ctx, cfg)
	if err != nil {
		readers.Close()
		return nil, err
	}
	r, err := start(ctx, readers)
	if err != nil {
		writers.Close()
		readers.Close()
		return nil, err
	}
	env := &benchEnv{reader: readers.Streams(), writer: writers.Streams(), db: readers.DB(), base: "http://" + r.addr, org: "bench-" + uuid.NewString()}
	env.tearDown = func() {
		r.stop()
		writers.Close()
		readers.Close()
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

// measure appends b.chunks through svc to b.writers streams of run runID,
// one writer each, while an SSE reader per stream follows it.
func (b streamBench) measure(ctx context.Context, env *benchEnv, svc *streams.Service, runID string) (streamResult, error) {
	per := b.perWriter()
	commits, receipts := make([][]time.Time, b.writers), make([][]time.Time, b.writers)
	// Each reader follows its stream through the typed client's live tail
	// (as a platform would: base64 decoded, in order); the writers start
	// once every reader's connection is answered 200, which it is once the
	// reader is subscribed. A reader whose first answer is another, or
	// whose connection is answered again (a cut, a reconnect: the wait
	// would count as tail latency), fails the run, as does one that gets
	// no answer: no connection for streamReaderOutage, or a connection
	// silent past the client's idle timeout (DefaultSSEIdleTimeout, which
	// counts the wait for the answer's headers).
	api, err := reveille.New(env.base, reveille.WithToken(env.tok),
		reveille.WithReconnect(reveille.ReconnectPolicy{MaxOutage: streamReaderOutage}))
	if err != nil {
		return streamResult{}, err
	}
	rctx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var readersDone errgroup.Group
	connections := make([]atomic.Int32, b.writers)
	for w := range b.writers {
		batches := (per[w] + b.batch - 1) / b.batch
		commits[w], receipts[w] = make([]time.Time, batches), make([]time.Time, batches)
		answered := make(chan int, 1) // the first answer's status; 0: the reader ended without one
		tail := api.Streams.Tail(rctx, runID, strconv.Itoa(w), reveille.TailParams{},
			reveille.WithResponse(func(res *http.Response) {
				if connections[w].Add(1) == 1 {
					answered <- res.StatusCode
				}
			}))
		var readerErr error // (set before answered <- 0)
		readersDone.Go(func() error {
			err := b.follow(tail, per[w], receipts[w])
			if connections[w].CompareAndSwap(0, 1) {
				readerErr = err
				answered <- 0
			}
			return err
		})
		if status := <-answered; status != http.StatusOK {
			stopReaders()
			_ = readersDone.Wait()
			if status != 0 {
				return streamResult{}, fmt.Errorf("SSE of stream %d: answered %d %s", w, status, http.StatusText(status))
			}
			return streamResult{}, fmt.Errorf("SSE of stream %d: %w", w, readerErr)
		}
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
	for w := range connections {
		if n := connections[w].Load(); n > 1 {
			return streamResult{}, fmt.Errorf("SSE of stream %d: %d connections (it was cut and resumed: the figures would count the reconnection)", w, n)
		}
	}
	var lat []time.Duration
	for w := range b.writers {
		for i, c := range commits[w] {
			lat = append(lat, max(0, receipts[w][i].Sub(c)))
		}
	}
	return streamResult{
		rate: float64(b.chunks) / elapsed.Seconds(),
		p50:  wakePct(lat, 50), p99: wakePct(lat, 99), // nearest rank, as every bench figure
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

// streamReaderOutage is how long a bench's SSE reader tries to connect
// (connections refused, answers that fail) before the run fails.
const streamReaderOutage = 5 * time.Second

// follow reads one stream's chunks until its end, stamping the receipt
// of each batch's last chunk.
func (b streamBench) follow(tail iter.Seq2[reveille.StreamChunk, error], total int, receipts []time.Time) error {
	seen := 0
	for ch, err := range tail {
		if err != nil {
			return fmt.Errorf("SSE ended after %d of %d chunks: %w", seen, total, err)
		}
		if ch.Index != int64(seen) {
			return fmt.Errorf("SSE: chunk %d, want %d", ch.Index, seen)
		}
		seen++
		if seen%b.batch == 0 || seen == total {
			receipts[(seen-1)/b.batch] = time.Now()
		}
	}
	if seen != total {
		return fmt.Errorf("SSE ended after %d of %d chunks", seen, total)
	}
	return nil
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
