package wakeup

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/inbox"
	"github.com/reveille/reveille/internal/db"
	"github.com/reveille/reveille/internal/testkit"
	"github.com/reveille/reveille/mandates"
)

// A completing transaction whose commit fails is recorded again by the
// pool: the wake-up is resolved once (one row, one signal), and
// reveille_wakeups_resolved_total must count it once.
func TestAResolutionWhoseCommitFailedIsNotCounted(t *testing.T) {
	sig := newRecordingSignaler()
	f := newFixtureWith(t, fixtureOptions{signals: sig})
	ctx := context.Background()
	testkit.FailFirstCommit(t, f.db, "fail_first_wake_commit", "INSERT", "queue_messages", "")

	w, err := f.svc.Create(ctx, params(""))
	require.NoError(t, err)
	f.requireSignalSent(t, w.ID.String())
	require.Equal(t, "resolved", f.state(t, w.ID))

	require.Equal(t, 1.0, testutil.ToFloat64(f.svc.metrics.resolved.WithLabelValues(OutcomeSucceeded)),
		"one wake-up resolved once; the rolled-back attempt must not count")
}

// A group whose transaction fails after its spends were decided sends
// each request through again alone: each spend is decided (and committed)
// once, but reveille_mandates_spends_total counted the group's rolled-back
// decisions too.
func TestSpendsDecidedInAFailedGroupAreNotCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, fixtureOptions{mandatesRegistry: reg})
	ctx := context.Background()
	_, err := f.db.Exec(ctx, `
		CREATE FUNCTION refuse_faulty() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.agent_id = 'faulty' THEN RAISE EXCEPTION 'faulty agent'; END IF; RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER refuse_faulty AFTER INSERT ON wakeups
		  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_faulty();`)
	require.NoError(t, err)
	_, err = f.mandates.Create(ctx, "o", mandates.CreateParams{AgentID: "faulty", Scope: "s", Budget: 10})
	require.NoError(t, err)
	funded, refused, faulty := params(""), params(""), params("")
	refused.Cost = 50 // past the budget of 10
	faulty.AgentID = "faulty"

	_, errs := f.createTogether(t, funded, refused, faulty)
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[2], "faulty agent")
	require.EqualValues(t, 3, f.spent(t), "the funded request spent once")

	got := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() == "reveille_mandates_spends_total" {
			for _, m := range fam.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	t.Logf("reveille_mandates_spends_total: %v", got)
	require.Equal(t, map[string]float64{"ok": 1, "refused": 1}, got,
		"one spend granted and one refused were committed (the faulty agent's spend rolled back with its intent)")
}

// A denial whose transaction rolls back (here: the approval event's
// webhook enqueue, which runs in it, fails) resolves nothing, yet
// reveille_wakeups_resolved_total{outcome="denied"} counted it; the retried
// denial counts it again: one wake-up denied, counted twice.
func TestADenialRolledBackIsNotCountedAsResolved(t *testing.T) {
	var failResolved atomic.Bool
	failResolved.Store(true)
	f := newFixtureWith(t, fixtureOptions{onAppend: func(_ context.Context, _ db.Querier, ev inbox.Event) error {
		if ev.Type == inbox.TypeResolved && failResolved.Load() {
			return errors.New("webhook enqueue failed")
		}
		return nil
	}})
	ctx := context.Background()
	p := params("")
	p.Cost = 50 // refused
	_, err := f.svc.Create(ctx, p)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)

	_, err = f.mandates.Deny(ctx, "o", refused.ApprovalID, "approver", "no")
	require.Error(t, err, "the denial rolled back")
	require.Equal(t, "awaiting_approval", f.state(t, refused.Wakeup.ID), "nothing resolved")

	failResolved.Store(false)
	_, err = f.mandates.Deny(ctx, "o", refused.ApprovalID, "approver", "no")
	require.NoError(t, err)
	require.Equal(t, "resolved", f.state(t, refused.Wakeup.ID))

	require.Equal(t, 1.0, testutil.ToFloat64(f.svc.metrics.resolved.WithLabelValues(OutcomeDenied)),
		"one wake-up denied once; the rolled-back denial must not count")
}

// A cancel whose commit fails (here a deferred trigger) canceled nothing:
// neither the wake-up resolved nor its approval request withdrawn count
// until the cancel that commits.
func TestACancelWhoseCommitFailedIsNotCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, fixtureOptions{mandatesRegistry: reg})
	ctx := context.Background()
	p := params("")
	p.Cost = 50 // refused: the wake-up awaits approval
	_, err := f.svc.Create(ctx, p)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	testkit.FailFirstCommit(t, f.db, "fail_first_cancel_commit", "UPDATE", "wakeups", "NEW.state = 'resolved'")

	_, err = f.svc.Cancel(ctx, "o", AnyAgent, refused.Wakeup.ID)
	require.Error(t, err, "the cancel's commit failed")
	require.Equal(t, "awaiting_approval", f.state(t, refused.Wakeup.ID))
	_, err = f.svc.Cancel(ctx, "o", AnyAgent, refused.Wakeup.ID)
	require.NoError(t, err)
	require.Equal(t, "resolved", f.state(t, refused.Wakeup.ID))

	require.Equal(t, 1.0, testutil.ToFloat64(f.svc.metrics.resolved.WithLabelValues(OutcomeCanceled)), "one wake-up canceled once")
	var withdrawn float64
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, fam := range families {
		if fam.GetName() == "reveille_mandates_approvals_resolved_total" {
			for _, m := range fam.GetMetric() {
				if m.GetLabel()[0].GetValue() == "canceled" {
					withdrawn = m.GetCounter().GetValue()
				}
			}
		}
	}
	require.Equal(t, 1.0, withdrawn, "one approval request withdrawn once")
}
