package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DispatchableCancelGroups are the pending cancel groups a dispatch can act
// on: those whose edge group has its flag set (their siblings are
// cancelled) or is missing (the pending row is deleted). A group whose flag
// is clear is left by the dispatch (LeftForReconciler) until the
// reconciler, which takes every pending group (PendingCancelGroups),
// deletes it: offered to the dispatcher it would cost a row job every tick
// that changes nothing. The dispatch still re-checks the flag under its
// lock, so a job for such a group (enqueued by someone else, or before the
// flag was cleared) changes nothing. Index:
// ff_pending_cancel_groups_enqueued_idx (partition_key, enqueued_at_ms);
// each pending row's edge group is read by its primary key (the LEFT JOIN
// in Join), a plain read that waits for no lock.
var DispatchableCancelGroups = &Due{
	What:   "pending cancel groups to dispatch",
	From:   "ff_pending_cancel_groups r",
	Exec:   PendingCancelGroups.Exec,
	Tenant: true,
	At:     "r.enqueued_at_ms",
	Always: true,
	Join: `LEFT JOIN ff_edge_group g
	         ON g.partition_key = r.partition_key AND g.flow_id = r.flow_id AND g.downstream_eid = r.downstream_eid`,
	Where: "COALESCE(g.cancel_siblings_pending_flag, true)",
	ID:    Key{"r.flow_id", "uuid"},
	ID2:   Key{"r.downstream_eid", "uuid"},
	Index: "ff_pending_cancel_groups_enqueued_idx",
}

// DispatchOutcome is what DispatchCancelGroup did with a pending group.
type DispatchOutcome int

// Dispatch outcomes, the seed's GroupOutcome.
const (
	// Dispatched: the flag was set; the listed siblings not yet terminal
	// were cancelled, the flag and members cleared and the pending row
	// deleted, in one commit.
	Dispatched DispatchOutcome = iota + 1
	// Orphaned: the edge group does not exist; the pending row was deleted.
	Orphaned
	// LeftForReconciler: the flag is clear; nothing changed. The
	// reconciler deletes such rows.
	LeftForReconciler
	// LeftLocked: another transaction holds the edge group; nothing
	// changed. The pending row stays, so the next dispatch scan offers the
	// group again.
	LeftLocked
	// DispatchOutsideTenant: the group's downstream execution is missing
	// or of another tenant than the filter's; nothing changed.
	DispatchOutsideTenant
)

func (o DispatchOutcome) String() string {
	return outcomeName(o, "DispatchOutcome", "dispatched", "orphaned", "left_for_reconciler", "left_locked", "outside_tenant")
}

// DispatchResult says what DispatchCancelGroup did.
type DispatchResult struct {
	Outcome DispatchOutcome
	// PendingDeleted: the pending row existed and was deleted (Dispatched,
	// Orphaned). An orphan whose pending row was already gone changed
	// nothing.
	PendingDeleted bool
	// Members is the number of member strings listed on the group.
	Members int
	// Cancelled is the number of siblings this dispatch cancelled; members
	// already terminal or cancelled keep their state, reason and author.
	Cancelled int
	// BadMembers are member strings that are not UUIDs, skipped.
	BadMembers []string
	// RawFieldsMalformed counts cancelled siblings whose raw_fields is not
	// a JSON object: last_mutation_at could not be set in it and it was
	// kept as it was (the seed's jsonb_set would fail the whole dispatch,
	// every time).
	RawFieldsMalformed int
}

// Changed reports whether the dispatch changed anything.
func (r DispatchResult) Changed() bool {
	return r.Outcome == Dispatched || (r.Outcome == Orphaned && r.PendingDeleted)
}

// cancelSiblingsSQL is the seed's per-sibling UPDATE, for all members at
// once, also clearing the blocking reason (a cancelled execution waits for
// nothing; FlowFabric's Valkey engine clears it). $1 partition, $2 sibling
// ids, $3 now (ms), $4 default reason.
const cancelSiblingsSQL = `
UPDATE ff_exec_core
   SET lifecycle_phase     = 'terminal',
       ownership_state     = 'unowned',
       eligibility_state   = 'not_applicable',
       public_state        = 'cancelled',
       blocking_reason     = NULL,
       attempt_state       = 'cancelled',
       terminal_at_ms      = COALESCE(terminal_at_ms, $3),
       cancellation_reason = COALESCE(cancellation_reason, $4),
       cancelled_by        = COALESCE(cancelled_by, 'engine'),
       raw_fields          = CASE WHEN jsonb_typeof(raw_fields) = 'object'
                                  THEN jsonb_set(raw_fields, '{last_mutation_at}', to_jsonb($3::bigint::text))
                                  ELSE raw_fields END
 WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])
   AND lifecycle_phase NOT IN ('terminal', 'cancelled')
RETURNING jsonb_typeof(raw_fields) = 'object'`

// SiblingQuorumSatisfied is the cancellation reason a dispatch writes on the
// siblings it cancels: FlowFabric raises the flag only when a CancelRemaining
// policy's quorum is satisfied.
const SiblingQuorumSatisfied = "sibling_quorum_satisfied"

// DispatchCancelGroup drains one pending cancel group, as the seed's
// dispatch_one_group, in one transaction. The edge group is locked with FOR
// UPDATE SKIP LOCKED: a group another transaction holds is left alone
// (LeftLocked) rather than waited for, and a non-locking probe tells it from
// a missing group (Orphaned). A second call for a drained group finds the
// flag clear and changes nothing.
//
// f is the fleet's tenant filter: a group whose downstream execution is
// outside it is left unchanged (an OutsideTenant outcome).
func DispatchCancelGroup(ctx context.Context, db Beginner, partition int16, flowID, downstreamEID string, nowMs int64, f Filter) (DispatchResult, error) {
	var r DispatchResult
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		if in, err := execInTenant(ctx, tx, partition, downstreamEID, f); err != nil || !in {
			r.Outcome = DispatchOutsideTenant
			return false, err
		}
		flag, members, found, err := lockEdgeGroup(ctx, tx, partition, flowID, downstreamEID, true)
		if err != nil {
			return false, err
		}
		if !found {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ff_edge_group
				 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid)`,
				partition, flowID, downstreamEID).Scan(&exists); err != nil {
				return false, fmt.Errorf("probe edge group: %w", err)
			}
			if exists {
				r.Outcome = LeftLocked
				return false, nil
			}
			r.Outcome = Orphaned
			r.PendingDeleted, err = deletePending(ctx, tx, partition, flowID, downstreamEID)
			return err == nil, err
		}
		r.Members = len(members)
		if !flag {
			r.Outcome = LeftForReconciler
			return false, nil
		}
		var ids []string
		ids, r.BadMembers = ParseMembers(members)
		if len(ids) > 0 {
			rows, err := tx.Query(ctx, cancelSiblingsSQL, partition, ids, nowMs, SiblingQuorumSatisfied)
			if err != nil {
				return false, fmt.Errorf("cancel siblings: %w", err)
			}
			rawOK, err := pgx.CollectRows(rows, pgx.RowTo[bool])
			if err != nil {
				return false, fmt.Errorf("cancel siblings: %w", err)
			}
			r.Cancelled = len(rawOK)
			for _, ok := range rawOK {
				if !ok {
					r.RawFieldsMalformed++
				}
			}
		}
		if err := clearGroup(ctx, tx, partition, flowID, downstreamEID); err != nil {
			return false, err
		}
		r.Outcome = Dispatched
		r.PendingDeleted, err = deletePending(ctx, tx, partition, flowID, downstreamEID)
		return err == nil, err
	})
	if err != nil {
		return DispatchResult{}, fmt.Errorf("dispatch cancel group %d/%s/%s: %w", partition, flowID, downstreamEID, err)
	}
	return r, nil
}
