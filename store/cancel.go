package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DuePendingCancelPartitions returns the partitions (0..partitionCount-1)
// holding at least one pending cancel group that passes f. A pending group
// is due as soon as it exists. Index: ff_pending_cancel_groups
// (partition_key, enqueued_at_ms), one probe per partition.
func DuePendingCancelPartitions(ctx context.Context, db DB, partitionCount int, f Filter) ([]int16, error) {
	args := []any{partitionCount}
	from, cond := `ff_pending_cancel_groups pc`, ""
	if !f.Empty() {
		cond, args = f.sql(args)
		from += ` JOIN ff_exec_core e ON e.partition_key = pc.partition_key AND e.execution_id = pc.downstream_eid`
	}
	probe := `SELECT 1 FROM ` + from + ` WHERE pc.partition_key = s.p` + cond
	parts, err := collectPartitions(db.Query(ctx, partitionsSQL(probe), args...))
	if err != nil {
		return nil, fmt.Errorf("find partitions with pending cancel groups: %w", err)
	}
	return parts, nil
}

// PendingCancelGroup is one ff_pending_cancel_groups row.
type PendingCancelGroup struct {
	FlowID        string
	DownstreamEID string
	EnqueuedAtMs  int64
}

// ScanPendingCancelGroups returns up to limit pending cancel groups of one
// partition, oldest enqueued first (then by flow and downstream execution, so
// the order is total and a scan can continue after any row), skipping groups
// whose downstream execution does not pass f. nowMs is unused: a pending
// group is due as soon as it exists; the parameter keeps the scan's shape.
// Index: ff_pending_cancel_groups (partition_key, enqueued_at_ms); the
// redundant lower bound on enqueued_at_ms lets a continuation start its index
// range at the cursor instead of filtering from the partition's oldest row.
func ScanPendingCancelGroups(ctx context.Context, db DB, partition int16, _ int64, after *After, limit int, f Filter) ([]PendingCancelGroup, error) {
	args := []any{partition, limit}
	cond := ""
	if after != nil {
		args = append(args, after.AtMs, after.ID, after.ID2)
		cond = ` AND pc.enqueued_at_ms >= $3
		 AND (pc.enqueued_at_ms, pc.flow_id, pc.downstream_eid) > ($3, $4::uuid, $5::uuid)`
	}
	from := `ff_pending_cancel_groups pc`
	if !f.Empty() {
		var fc string
		fc, args = f.sql(args)
		cond += fc
		from += ` JOIN ff_exec_core e ON e.partition_key = pc.partition_key AND e.execution_id = pc.downstream_eid`
	}
	rows, err := db.Query(ctx, `
		SELECT pc.flow_id::text, pc.downstream_eid::text, pc.enqueued_at_ms
		  FROM `+from+`
		 WHERE pc.partition_key = $1`+cond+`
		 ORDER BY pc.enqueued_at_ms, pc.flow_id, pc.downstream_eid
		 LIMIT $2`, args...)
	if err != nil {
		return nil, fmt.Errorf("scan pending cancel groups in partition %d: %w", partition, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingCancelGroup, error) {
		var g PendingCancelGroup
		err := r.Scan(&g.FlowID, &g.DownstreamEID, &g.EnqueuedAtMs)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("scan pending cancel groups in partition %d: %w", partition, err)
	}
	return out, nil
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
)

func (o DispatchOutcome) String() string {
	switch o {
	case Dispatched:
		return "dispatched"
	case Orphaned:
		return "orphaned"
	case LeftForReconciler:
		return "left_for_reconciler"
	case LeftLocked:
		return "left_locked"
	}
	return fmt.Sprintf("DispatchOutcome(%d)", int(o))
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
// once. $1 partition, $2 sibling ids, $3 now (ms), $4 default reason.
const cancelSiblingsSQL = `
UPDATE ff_exec_core
   SET lifecycle_phase     = 'terminal',
       ownership_state     = 'unowned',
       eligibility_state   = 'not_applicable',
       public_state        = 'cancelled',
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
func DispatchCancelGroup(ctx context.Context, db Beginner, partition int16, flowID, downstreamEID string, nowMs int64) (DispatchResult, error) {
	var r DispatchResult
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
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
)

func (o ReconcileOutcome) String() string {
	switch o {
	case PendingGone:
		return "pending_gone"
	case StaleDeleted:
		return "stale_deleted"
	case Cleared:
		return "cleared"
	case LeftLive:
		return "left_live"
	}
	return fmt.Sprintf("ReconcileOutcome(%d)", int(o))
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
func ReconcileCancelGroup(ctx context.Context, db Beginner, partition int16, flowID, downstreamEID string) (ReconcileResult, error) {
	var r ReconcileResult
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
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

// inTx runs fn in a transaction, committing when it returns true and rolling
// back otherwise (a pass that changed nothing releases its locks without a
// commit record).
func inTx(ctx context.Context, db Beginner, fn func(pgx.Tx) (commit bool, err error)) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) && err == nil {
			err = fmt.Errorf("rollback: %w", rbErr)
		}
	}()
	commit, err := fn(tx)
	if err != nil || !commit {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
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
		if id, ok := parseUUID(m); ok {
			ids = append(ids, id)
		} else {
			bad = append(bad, m)
		}
	}
	return ids, bad
}

func parseUUID(s string) (string, bool) {
	switch {
	case len(s) == 38 && s[0] == '{' && s[37] == '}':
		s = s[1:37]
	case len(s) == 45 && strings.EqualFold(s[:9], "urn:uuid:"):
		s = s[9:]
	}
	var hex []byte
	switch len(s) {
	case 32:
		hex = []byte(s)
	case 36:
		for i := 0; i < 36; i++ {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if s[i] != '-' {
					return "", false
				}
				continue
			}
			hex = append(hex, s[i])
		}
	default:
		return "", false
	}
	for i, c := range hex {
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			hex[i] = c + ('a' - 'A')
		default:
			return "", false
		}
	}
	h := string(hex)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], true
}
