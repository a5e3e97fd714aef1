package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReconcileOutcome is what ReconcileCancelGroup did with a pending group.
type ReconcileOutcome int

// Reconcile outcomes.
const (
	// PendingGone: the pending row no longer exists (a dispatch drained
	// it); nothing changed.
	PendingGone ReconcileOutcome = iota + 1
	// StaleDeleted: the edge group is missing or its flag is clear; the
	// pending row was deleted.
	StaleDeleted
	// Cleared: the flag was set but no listed member is live (all are
	// terminal or cancelled, missing, or none is a UUID); the flag and
	// members were cleared and the pending row deleted.
	Cleared
	// LeftLive: the flag is set and a listed member is still live; nothing
	// changed. The dispatcher cancels it.
	LeftLive
	// ReconcileOutsideTenant: the group's downstream execution is missing
	// or of another tenant than the filter's; nothing changed.
	ReconcileOutsideTenant
)

func (o ReconcileOutcome) String() string {
	return outcomeName(o, "ReconcileOutcome", "pending_gone", "stale_deleted", "cleared", "left_live", "outside_tenant")
}

// ReconcileResult says what ReconcileCancelGroup did.
type ReconcileResult struct {
	Outcome ReconcileOutcome
	// GroupMissing: the edge group does not exist (with StaleDeleted).
	GroupMissing bool
	// Live is the number of listed members still live (with LeftLive).
	Live int
	// BadMembers are member strings that are not UUIDs, ignored.
	BadMembers []string
}

// Changed reports whether the reconcile changed anything.
func (r ReconcileResult) Changed() bool { return r.Outcome == StaleDeleted || r.Outcome == Cleared }

// ReconcileCancelGroup settles one pending cancel group the dispatcher does
// not drain, in one transaction: a pending row whose edge group is missing
// or whose flag is clear is deleted; a set flag whose members are all
// terminal or cancelled (a member whose execution row is missing counts as
// not live, since no cancel could reach it) is cleared with the pending row;
// a group with a live member is left to the dispatcher.
//
// It locks the edge group with a plain FOR UPDATE, waiting for a dispatch in
// progress rather than skipping it: a dispatch transaction lasts
// milliseconds, the reconciler runs every few seconds, and after the wait
// it decides on the dispatch's committed result (usually: pending row gone)
// instead of deferring a whole interval. Locks are taken in the dispatcher's
// order, edge group then pending row, so the two cannot deadlock; the wait
// is bounded by the caller's context.
//
// f is the fleet's tenant filter: a group whose downstream execution is
// outside it is left unchanged (an OutsideTenant outcome).
func ReconcileCancelGroup(ctx context.Context, db Beginner, partition int16, flowID, downstreamEID string, f Filter) (ReconcileResult, error) {
	var r ReconcileResult
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		if in, err := execInTenant(ctx, tx, partition, downstreamEID, f); err != nil || !in {
			r.Outcome = ReconcileOutsideTenant
			return false, err
		}
		flag, members, found, err := lockEdgeGroup(ctx, tx, partition, flowID, downstreamEID, false)
		if err != nil {
			return false, err
		}
		err = tx.QueryRow(ctx, `SELECT true FROM ff_pending_cancel_groups
			 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid
			   FOR UPDATE`, partition, flowID, downstreamEID).Scan(new(bool))
		if errors.Is(err, pgx.ErrNoRows) {
			r.Outcome = PendingGone
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("lock pending row: %w", err)
		}
		if !found || !flag {
			r.Outcome, r.GroupMissing = StaleDeleted, !found
			_, err := deletePending(ctx, tx, partition, flowID, downstreamEID)
			return err == nil, err
		}
		var ids []string
		ids, r.BadMembers = ParseMembers(members)
		if len(ids) > 0 {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM ff_exec_core
				 WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])
				   AND lifecycle_phase NOT IN ('terminal', 'cancelled')`, partition, ids).Scan(&r.Live); err != nil {
				return false, fmt.Errorf("count live members: %w", err)
			}
		}
		if r.Live > 0 {
			r.Outcome = LeftLive
			return false, nil
		}
		if err := clearGroup(ctx, tx, partition, flowID, downstreamEID); err != nil {
			return false, err
		}
		r.Outcome = Cleared
		_, err = deletePending(ctx, tx, partition, flowID, downstreamEID)
		return err == nil, err
	})
	if err != nil {
		return ReconcileResult{}, fmt.Errorf("reconcile cancel group %d/%s/%s: %w", partition, flowID, downstreamEID, err)
	}
	return r, nil
}
