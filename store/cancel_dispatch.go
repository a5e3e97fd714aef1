package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Sibling-cancel dispatch and its reconciler both walk ff_pending_cancel_groups.
//
// Tenant filter. FlowFabric's dispatcher accepts a ScannerFilter and ignores
// it. Here it is applied: a pending group belongs to the tenant of its
// downstream execution, ff_exec_core (partition_key, downstream_eid), the
// execution whose edge group it is, and passes when that execution passes the
// filter. A group whose downstream execution row is missing never passes a
// non-empty filter, like every other row. The siblings a dispatch cancels are
// not checked one by one: they belong to the same flow, hence the same
// tenant.
//
// Transactions. Unlike the other row actions, the two group actions are
// short transactions rather than one statement: the dispatcher must tell a
// group locked by someone else (SKIP LOCKED returns nothing) from a missing
// one with a second, non-locking probe, exactly as the seed does, and both
// branch on the group's members.

// PendingCancelGroups are ff_pending_cancel_groups rows, due as soon as they
// exist and taken oldest enqueued first. A group belongs to the tenant of its
// downstream execution. Index: ff_pending_cancel_groups_enqueued_idx
// (partition_key, enqueued_at_ms).
var PendingCancelGroups = &Due{
	What:   "pending cancel groups",
	From:   "ff_pending_cancel_groups r",
	Exec:   "ff_exec_core e ON e.partition_key = r.partition_key AND e.execution_id = r.downstream_eid",
	Tenant: true,
	At:     "r.enqueued_at_ms",
	Always: true,
	ID:     Key{"r.flow_id", "uuid"},
	ID2:    Key{"r.downstream_eid", "uuid"},
	Index:  "ff_pending_cancel_groups_enqueued_idx",
}

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

// outcomeName names o, one of the iota + 1 constants whose names are given
// in order.
func outcomeName[O ~int](o O, typ string, names ...string) string {
	if o >= 1 && int(o) <= len(names) {
		return names[o-1]
	}
	return fmt.Sprintf("%s(%d)", typ, int(o))
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

// lockEdgeGroup locks an edge group and reads its flag and members. With
// skipLocked, a group another transaction holds reads as not found.
//
// FlowFabric never writes NULL elements into the members array, but the
// column type allows them: they are read as NullMember, which is not a UUID,
// so they are skipped with a warning like any other malformed member instead
// of failing the whole group on every retry.
func lockEdgeGroup(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string, skipLocked bool) (flag bool, members []string, found bool, err error) {
	lock := `FOR UPDATE`
	if skipLocked {
		lock = `FOR UPDATE SKIP LOCKED`
	}
	var raw []pgtype.Text
	err = tx.QueryRow(ctx, `
		SELECT cancel_siblings_pending_flag, cancel_siblings_pending_members
		  FROM ff_edge_group
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid
		 `+lock, partition, flowID, downstreamEID).Scan(&flag, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil, false, nil
	}
	if err != nil {
		return false, nil, false, fmt.Errorf("lock edge group: %w", err)
	}
	members = make([]string, len(raw))
	for i, m := range raw {
		members[i] = NullMember
		if m.Valid {
			members[i] = m.String
		}
	}
	return flag, members, true, nil
}

// NullMember stands for a NULL element of cancel_siblings_pending_members in
// results and warnings.
const NullMember = "NULL"

func clearGroup(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string) error {
	_, err := tx.Exec(ctx, `
		UPDATE ff_edge_group
		   SET cancel_siblings_pending_flag = false,
		       cancel_siblings_pending_members = '{}'::text[]
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid`,
		partition, flowID, downstreamEID)
	if err != nil {
		return fmt.Errorf("clear edge group: %w", err)
	}
	return nil
}

func deletePending(ctx context.Context, tx pgx.Tx, partition int16, flowID, downstreamEID string) (bool, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM ff_pending_cancel_groups
		 WHERE partition_key = $1 AND flow_id = $2::uuid AND downstream_eid = $3::uuid`,
		partition, flowID, downstreamEID)
	if err != nil {
		return false, fmt.Errorf("delete pending row: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// ParseMembers splits an edge group's member strings into UUIDs, in
// canonical lower-case hyphenated form, and strings that are not UUIDs. It
// accepts the forms the seed's Uuid::parse_str does: hyphenated, 32 hex
// digits, braced and urn:uuid:. Duplicates are kept; the UPDATE matches each
// execution once.
func ParseMembers(members []string) (ids, bad []string) {
	for _, m := range members {
		if id, err := uuid.Parse(m); err == nil {
			ids = append(ids, id.String())
		} else {
			bad = append(bad, m)
		}
	}
	return ids, bad
}
