package mandates

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/internal/apperr"
)

func TestCreateMakesAnActiveMandateWithNothingSpent(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	until := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	m, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 7, ValidUntil: &until})
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), m.ID.Version())
	require.Equal(t, "org-a", m.OrgID)
	require.EqualValues(t, 7, m.Budget)
	require.Zero(t, m.Spent)
	require.Equal(t, StatusActive, m.Status)
	require.True(t, until.Equal(*m.ValidUntil))
	require.Equal(t, m, mustGet(t, s, "org-a", m))
}

func TestCreatingAnExistingMandateIsAConflict(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	mustCreate(t, s, "org-a", "agent-1", "llm", 7)
	_, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 1})
	require.ErrorIs(t, err, ErrExists)
	require.ErrorIs(t, err, apperr.ErrConflict)
	_, err = s.Create(ctx, "org-b", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 1})
	require.NoError(t, err, "another org's mandate is its own")
}

func TestCreateAndPatchRejectBadInputNamingTheField(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	for field, p := range map[string]CreateParams{
		"agent_id": {Scope: "s", Budget: 1},
		"scope":    {AgentID: "a", Budget: 1},
		"budget":   {AgentID: "a", Scope: "s", Budget: -1},
	} {
		_, err := s.Create(ctx, "org-a", p)
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, field)
		require.Equal(t, field, inv.Fields[0].Field)
	}
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 7)
	for field, p := range map[string]PatchParams{
		"budget": {Budget: ptr[int64](-5)},
		"status": {Status: ptr("paused")},
	} {
		_, err := s.Patch(ctx, "org-a", AnyAgent, m.ID, p)
		var inv *apperr.InvalidError
		require.ErrorAs(t, err, &inv, field)
		require.Equal(t, field, inv.Fields[0].Field)
	}
	require.Equal(t, m, mustGet(t, s, "org-a", m))
}

func TestPatchChangesOnlyTheGivenFields(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	until := time.Now().Add(time.Hour)
	m, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 7, ValidUntil: &until})
	require.NoError(t, err)

	p, err := s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Budget: ptr[int64](9)})
	require.NoError(t, err)
	require.EqualValues(t, 9, p.Budget)
	require.Equal(t, StatusActive, p.Status)
	require.NotNil(t, p.ValidUntil)

	p, err = s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Status: ptr(StatusRevoked), SetValidUntil: true})
	require.NoError(t, err)
	require.EqualValues(t, 9, p.Budget)
	require.Equal(t, StatusRevoked, p.Status)
	require.Nil(t, p.ValidUntil, "valid_until cleared")
	require.True(t, p.UpdatedAt.After(m.UpdatedAt) || p.UpdatedAt.Equal(m.UpdatedAt))
}

func TestAPatchThatChangesNothingKeepsUpdatedAt(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	until := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	m, err := s.Create(ctx, "org-a", CreateParams{AgentID: "agent-1", Scope: "llm", Budget: 7, ValidUntil: &until})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		p    PatchParams
	}{
		{"an empty patch", PatchParams{}},
		{"the same budget", PatchParams{Budget: ptr[int64](7)}},
		{"the same status", PatchParams{Status: ptr(StatusActive)}},
		{"the same valid_until", PatchParams{SetValidUntil: true, ValidUntil: &until}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := s.Patch(ctx, "org-a", AnyAgent, m.ID, tc.p)
			require.NoError(t, err)
			require.Equal(t, m, p)
		})
	}
	time.Sleep(time.Millisecond) // (now() must move past the creation's)
	p, err := s.Patch(ctx, "org-a", AnyAgent, m.ID, PatchParams{Budget: ptr[int64](8)})
	require.NoError(t, err)
	require.True(t, p.UpdatedAt.After(m.UpdatedAt), "a change moves updated_at: %v → %v", m.UpdatedAt, p.UpdatedAt)
}

func TestAnotherOrgsMandateIsNotFound(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 7)
	_, err := s.Get(ctx, "org-b", AnyAgent, m.ID)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Patch(ctx, "org-b", AnyAgent, m.ID, PatchParams{Budget: ptr[int64](100)})
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = s.Ledger(ctx, "org-b", AnyAgent, m.ID, Page{})
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Find(ctx, "org-b", "agent-1", "llm")
	require.ErrorIs(t, err, ErrNotFound)
	require.EqualValues(t, 7, mustGet(t, s, "org-a", m).Budget)
}

// A lookup narrowed to one agent finds another agent's mandate no more
// than another org's: the same ErrNotFound, and nothing changed.
func TestAnotherAgentsMandateIsNotFoundByALookupNarrowedToAnAgent(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 7)

	_, err := s.Get(ctx, "org-a", "agent-2", m.ID)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = s.Patch(ctx, "org-a", "agent-2", m.ID, PatchParams{Budget: ptr[int64](100)})
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = s.Ledger(ctx, "org-a", "agent-2", m.ID, Page{})
	require.ErrorIs(t, err, ErrNotFound)

	own, err := s.Get(ctx, "org-a", "agent-1", m.ID)
	require.NoError(t, err)
	require.EqualValues(t, 7, own.Budget, "the other agent's patch changed nothing")
	_, err = s.Patch(ctx, "org-a", "agent-1", m.ID, PatchParams{Budget: ptr[int64](8)})
	require.NoError(t, err)
	_, _, err = s.Ledger(ctx, "org-a", "agent-1", m.ID, Page{})
	require.NoError(t, err)
}

func TestListFiltersByAgentAndScopeAndPages(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	var want []uuid.UUID
	for _, sc := range []string{"a", "b", "c", "d", "e"} {
		want = append(want, mustCreate(t, s, "org-a", "agent-1", sc, 1).ID)
	}
	mustCreate(t, s, "org-a", "agent-2", "a", 1)
	mustCreate(t, s, "org-b", "agent-1", "a", 1)

	var got []uuid.UUID
	page := Page{Limit: 2}
	pages := 0
	for {
		items, next, err := s.List(ctx, "org-a", MandateFilter{AgentID: "agent-1"}, page)
		require.NoError(t, err)
		pages++
		for _, m := range items {
			got = append(got, m.ID)
		}
		if next == nil {
			break
		}
		page.Cursor = *next
	}
	require.Equal(t, want, got)
	require.Equal(t, 3, pages)

	byScope, _, err := s.List(ctx, "org-a", MandateFilter{Scope: "a"}, Page{})
	require.NoError(t, err)
	require.Len(t, byScope, 2)
	exact, _, err := s.List(ctx, "org-a", MandateFilter{AgentID: "agent-2", Scope: "a"}, Page{})
	require.NoError(t, err)
	require.Len(t, exact, 1)
}

func TestTheLedgerPagesInTimeOrder(t *testing.T) {
	s, _ := newTestService(t)
	ctx := context.Background()
	m := mustCreate(t, s, "org-a", "agent-1", "llm", 100)
	for i := range 5 {
		_, err := s.Spend(ctx, SpendParams{OrgID: "org-a", AgentID: "agent-1", Scope: "llm", Cost: int64(i + 1), Reason: "r"})
		require.NoError(t, err)
	}
	first, next, err := s.Ledger(ctx, "org-a", AnyAgent, m.ID, Page{Limit: 3})
	require.NoError(t, err)
	require.NotNil(t, next)
	rest, end, err := s.Ledger(ctx, "org-a", AnyAgent, m.ID, Page{Cursor: *next, Limit: 3})
	require.NoError(t, err)
	require.Nil(t, end)
	var amounts []int64
	for _, e := range append(first, rest...) {
		require.Equal(t, KindDebit, e.Kind)
		require.Equal(t, "r", e.Reason)
		amounts = append(amounts, e.Amount)
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5}, amounts)
}
