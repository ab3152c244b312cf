package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/workpool"
)

// wakeupPool takes work only through the mandate gate (POST /v1/wakeups).
const wakeupPool = "wakeup"

func (s *Server) workRoutes() {
	if s.svc.Workpool == nil {
		return
	}
	orgWide := refuseBoundTokens("plain work and pools belong to the org, not to an agent (an agent asks for work through POST /v1/wakeups)")
	s.route(http.MethodPost, "/v1/pools/:pool/work", s.enqueueWork, []string{RoleAdmin}, orgWide, s.idempotent())
	s.route(http.MethodGet, "/v1/work/:id", s.getWork, []string{RoleAdmin, RoleAgent})
	s.route(http.MethodPost, "/v1/work/:id/cancel", s.cancelWork, []string{RoleAdmin}, s.idempotent())
	s.route(http.MethodGet, "/v1/pools", s.listPools, []string{RoleAdmin}, orgWide)
	s.route(http.MethodGet, "/v1/pools/:pool", s.getPool, []string{RoleAdmin}, orgWide)
	s.route(http.MethodPatch, "/v1/pools/:pool", s.patchPool, []string{RoleOperator}, orgWide)
	s.route(http.MethodPost, "/v1/pools/:pool/pause", s.pausePool, []string{RoleOperator}, orgWide)
	s.route(http.MethodPost, "/v1/pools/:pool/resume", s.resumePool, []string{RoleOperator}, orgWide)
}

type workIn struct {
	Handler        string          `json:"handler" required:"true"`
	Args           json.RawMessage `json:"args"`
	RunAt          *string         `json:"run_at"`
	Retry          *retryIn        `json:"retry"`
	TimeoutMS      *int            `json:"timeout_ms"`
	ConcurrencyKey string          `json:"concurrency_key" nullable:"true"`
	KeyLimit       *int            `json:"key_limit" nullable:"true"`
}

type workJSON struct {
	ID               string          `json:"id"`
	Pool             string          `json:"pool"`
	Handler          string          `json:"handler"`
	State            string          `json:"state"`
	PreviousAttempts int             `json:"previous_attempts"`
	Outcome          *string         `json:"outcome,omitempty"`
	Result           json.RawMessage `json:"result,omitempty"`
	Error            *string         `json:"error,omitempty"`
	Attempts         *int            `json:"attempts,omitempty"`
	RunAt            time.Time       `json:"run_at"`
	CreatedAt        time.Time       `json:"created_at"`
	FinishedAt       *time.Time      `json:"finished_at,omitempty"`
	ConcurrencyKey   string          `json:"concurrency_key,omitempty"`
	KeyLimit         int             `json:"key_limit,omitempty"`
}

func workOut(st workpool.Status) workJSON {
	out := workJSON{
		ID: st.ID.String(), Pool: st.Pool, Handler: st.Handler, State: string(st.State), PreviousAttempts: st.PreviousAttempts,
		RunAt: st.RunAt.UTC(), CreatedAt: st.CreatedAt.UTC(), ConcurrencyKey: st.ConcurrencyKey, KeyLimit: st.KeyLimit,
	}
	if st.State != workpool.StateFinished {
		return out
	}
	outcome, attempts, finished := string(st.Outcome), st.Attempts, st.FinishedAt.UTC()
	out.Outcome, out.Attempts, out.FinishedAt = &outcome, &attempts, &finished
	switch st.Outcome {
	case workpool.OutcomeSucceeded:
		out.Result = st.Result
		if len(out.Result) == 0 {
			out.Result = json.RawMessage("null")
		}
	case workpool.OutcomeFailed:
		out.Error = &st.Error
	}
	return out
}

// enqueueWork adds plain work to a pool, outside the mandate gate (hence
// admin only, and never to the wakeup pool).
func (s *Server) enqueueWork(c echo.Context) error {
	p, err := bindBody(c, decodeWorkEnqueue)
	if err != nil {
		return err
	}
	pool := c.Param("pool")
	if pool == wakeupPool {
		return Invalid("pool", "the wakeup pool takes work only through POST /v1/wakeups")
	}
	// The key goes to the pool too: a retry whose first attempt committed
	// but answered 5xx (which the HTTP layer does not keep) enqueues once.
	p.OrgID, p.Pool, p.IdempotencyKey = PrincipalFrom(c).OrgID, pool, IdempotencyKey(c)
	ctx := c.Request().Context()
	id, err := s.svc.Workpool.Enqueue(ctx, p)
	if errors.Is(err, workpool.ErrIdempotencyKeyReused) {
		return NewProblem(http.StatusUnprocessableEntity, "idempotency-key-reused", err.Error())
	}
	if err != nil {
		return err
	}
	st, err := s.svc.Workpool.Status(ctx, p.OrgID, id)
	if workpool.IsNotFound(err) {
		// Only a replayed key's work can be gone: it finished and its
		// record was purged while the key is still kept.
		return NewProblem(http.StatusConflict, "idempotency-key-used",
			"this Idempotency-Key enqueued work "+id.String()+", which has finished and is no longer kept").With("work_id", id)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, workOut(st))
}

// workID parses the :id parameter; a malformed id names no work of the
// caller's, so it is a 404 like any other.
func workID(c echo.Context) (uuid.UUID, error) {
	id, err := parseUUID(c.Param("id"))
	if err != nil {
		return uuid.Nil, workpool.ErrNotFound
	}
	return id, nil
}

func (s *Server) getWork(c echo.Context) error {
	id, err := workID(c)
	if err != nil {
		return err
	}
	st, err := s.workStatus(c.Request().Context(), PrincipalFrom(c), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, workOut(st))
}

// cancelWork asks for the work to be canceled and answers with where it
// stands now (the loop finishes the cancelation moments later).
func (s *Server) cancelWork(c echo.Context) error {
	id, err := workID(c)
	if err != nil {
		return err
	}
	ctx, org := c.Request().Context(), PrincipalFrom(c).OrgID
	if _, err := s.workStatus(ctx, PrincipalFrom(c), id); err != nil {
		return err
	}
	if err := s.svc.Workpool.Cancel(ctx, org, id); err != nil {
		return err
	}
	st, err := s.svc.Workpool.Status(ctx, org, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, workOut(st))
}

type runStatusJSON struct {
	Kind      string     `json:"kind"`
	Saturated *bool      `json:"saturated,omitempty"`
	At        *time.Time `json:"at,omitempty"`
}

type poolJSON struct {
	Name                 string          `json:"name"`
	MaxParallelism       int             `json:"max_parallelism"`
	MaxParallelismPerOrg *int            `json:"max_parallelism_per_org"`
	Paused               bool            `json:"paused"`
	RunStatus            runStatusJSON   `json:"run_status"`
	Running              int64           `json:"running"`
	Pending              int64           `json:"pending"`
	BlockedByKey         int64           `json:"blocked_by_key"`
	BlockedByOrgCap      int64           `json:"blocked_by_org_cap"`
	OldestPendingAgeS    float64         `json:"oldest_pending_age_s"`
	Weight               int             `json:"weight"`
	Report               workpool.Report `json:"report"`
	// OrgWeights is in the operator routes' answers only (it spans orgs),
	// and always there, {} when every org has the default.
	OrgWeights *map[string]int `json:"org_weights,omitempty"`
}

// poolOut is the pool as the caller sees it. Its run_status is the pool
// loop's for an operator (whose settings span orgs); for any other caller
// it is the one the caller's org's work alone would give, for the loop's
// comes of every org's work — another org's timed wake-ups, or its work
// filling the pool, would show through it.
func poolOut(c echo.Context, p workpool.PoolInfo) poolJSON {
	st := p.RunStatus
	if PrincipalFrom(c).HasRole(RoleOperator) {
		st = p.LoopStatus
	}
	out := poolJSON{
		Name: p.Name, MaxParallelism: p.MaxParallelism, MaxParallelismPerOrg: p.MaxParallelismPerOrg, Paused: p.Paused,
		RunStatus: runStatusJSON{Kind: st.Kind}, Running: p.Running, Pending: p.Pending,
		BlockedByKey: p.BlockedByKey, BlockedByOrgCap: p.BlockedByOrgCap,
		OldestPendingAgeS: p.OldestPendingAgeSeconds, Weight: p.Weight, Report: p.Report,
	}
	if st.Kind == "scheduled" {
		sat := st.Saturated
		out.RunStatus.Saturated = &sat
		if st.At != nil {
			at := st.At.UTC()
			out.RunStatus.At = &at
		}
	}
	return out
}

func (s *Server) listPools(c echo.Context) error {
	infos, err := s.svc.Workpool.Pools(c.Request().Context(), PrincipalFrom(c).OrgID)
	if err != nil {
		return err
	}
	infos, next, err := namePage(c, infos, func(p workpool.PoolInfo) string { return p.Name })
	if err != nil {
		return err
	}
	items := make([]poolJSON, 0, len(infos))
	for _, p := range infos {
		items = append(items, poolOut(c, p))
	}
	return c.JSON(http.StatusOK, map[string]any{"items": items, "next_cursor": next})
}

func (s *Server) getPool(c echo.Context) error {
	info, err := s.svc.Workpool.Pool(c.Request().Context(), PrincipalFrom(c).OrgID, c.Param("pool"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, poolOut(c, info))
}

type poolPatch struct {
	MaxParallelism *int `json:"max_parallelism"`
	// MaxParallelismPerOrg and OrgWeights are tri-state: absent keeps,
	// null removes.
	MaxParallelismPerOrg json.RawMessage `json:"max_parallelism_per_org"`
	OrgWeights           json.RawMessage `json:"org_weights"`
}

// patchPool changes a pool's limits and weights live, all or none
// (operator: the settings span orgs).
func (s *Server) patchPool(c echo.Context) error {
	u, err := bindBody(c, decodePoolPatch)
	if err != nil {
		return err
	}
	ctx, name := c.Request().Context(), c.Param("pool")
	if err := s.svc.Workpool.UpdatePool(ctx, name, u); err != nil {
		return err
	}
	return s.operatorPool(c, name)
}

// pausePool stops the pool's starts until resumePool; pausing a paused
// pool changes nothing.
func (s *Server) pausePool(c echo.Context) error {
	if err := s.svc.Workpool.Pause(c.Request().Context(), c.Param("pool")); err != nil {
		return err
	}
	return s.operatorPool(c, c.Param("pool"))
}

func (s *Server) resumePool(c echo.Context) error {
	if err := s.svc.Workpool.Resume(c.Request().Context(), c.Param("pool")); err != nil {
		return err
	}
	return s.operatorPool(c, c.Param("pool"))
}

// operatorPool answers an operator route with the pool as its caller's org
// sees it and every org's weight.
func (s *Server) operatorPool(c echo.Context, name string) error {
	ctx := c.Request().Context()
	info, err := s.svc.Workpool.Pool(ctx, PrincipalFrom(c).OrgID, name)
	if err != nil {
		return err
	}
	out := poolOut(c, info)
	weights, err := s.svc.Workpool.OrgWeights(ctx, name)
	if err != nil {
		return err
	}
	if weights == nil {
		weights = map[string]int{}
	}
	out.OrgWeights = &weights
	return c.JSON(http.StatusOK, out)
}
