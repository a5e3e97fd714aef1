package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The cancel backlog: FlowFabric's flow cancel (cancel_flow_header,
// operator.rs:897-1140) writes one ff_cancel_backlog header per cancelled
// flow and one ff_cancel_backlog_member row per member it cancelled, keyed
// by the member's wire id "{fp:N}:<uuid>"; its server acks the members
// (ack_cancel_member, operator.rs:1152-1217) of cancel_all cancels only,
// and nothing on Postgres drains the rest (FlowFabric's changelog and parity
// matrix say a reconciler does). DrainCancelBacklog is FlowFabric's Valkey
// cancel_reconciler run against these tables.
//
// Tenant filter. As FlowFabric's Valkey scanner applies it, per member: a
// member whose execution is of another tenant (or missing) is neither
// cancelled nor acked, and a header passes the filter when one of its
// members' executions does (CancelBacklogHeaders.TenantVia). A member id
// that is not a wire id has no tenant; it is deleted with a warning as
// FlowFabric's scanner SREMs a malformed member, whatever the filter.

// CancelBacklogBatch and CancelBacklogMembers are FlowFabric's batches
// (cancel_reconciler.rs BATCH_SIZE, MAX_MEMBERS_PER_FLOW_PER_CYCLE): a tick
// takes at most this many headers of a partition, and a header's row job
// at most this many of its members; the rest wait for the next tick.
const (
	CancelBacklogBatch   = 50
	CancelBacklogMembers = 500
)

// memberUUIDSQL is the execution UUID of the backlog member aliased m when
// its id is the wire id of an execution of its own partition,
// "{fp:<partition_key>}:<hyphenated uuid>" (what FlowFabric's header writes,
// member_wire_id), else NULL: the CASE keeps any other string from reaching
// the cast. ParseWireID is the same test in Go.
const memberUUIDSQL = `CASE WHEN m.execution_id ~ ('^\{fp:' || m.partition_key::text || '\}:` + uuidPattern + `$')
                  THEN right(m.execution_id, 36)::uuid END`

const uuidPattern = `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`

var wireIDPattern = regexp.MustCompile(`^\{fp:([0-9]+)\}:(` + uuidPattern + `)$`)

// ParseWireID returns the execution UUID (lower case) of a backlog member
// id of partition: "{fp:<partition>}:<hyphenated uuid>", as FlowFabric's
// header writes it. ok is false for anything else, a member of another
// partition among them (FlowFabric's flow members share its partition).
func ParseWireID(id string, partition int16) (uuid string, ok bool) {
	m := wireIDPattern.FindStringSubmatch(id)
	if m == nil || m[1] != strconv.Itoa(int(partition)) {
		return "", false
	}
	return lowerHex(m[2]), true
}

func lowerHex(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'F' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// CancelBacklogHeaders are ff_cancel_backlog headers whose grace is over:
// the reconciler compares requested_at_ms with now less the grace
// (Reconciler.Behind, --cancel-backlog-grace), since FlowFabric's Postgres
// header never sets grace_until_ms; a header that has one is taken from
// requested_at_ms + grace and acted on once grace_until_ms has passed too
// (DrainCancelBacklog re-checks COALESCE(grace_until_ms, requested_at_ms +
// grace) under its lock), at or before now as in FlowFabric's
// ZRANGEBYSCORE -inf now.
//
// Index: ffreconcile_cancel_backlog_requested_idx (partition_key,
// requested_at_ms), ours (migrations/cancel_backlog.go): FlowFabric's only
// other index, ff_cancel_backlog_grace_idx, holds the headers whose
// grace_until_ms is set, which it never sets. A probe reads one entry per
// partition and a scan O(due headers); with a tenant filter each header's
// members are read by the member table's primary key and their executions
// by ff_exec_core's.
var CancelBacklogHeaders = &Due{
	What:   "cancel backlog headers past their grace",
	From:   "ff_cancel_backlog r",
	Tenant: true,
	TenantVia: `ff_cancel_backlog_member m
	            JOIN ff_exec_core e ON e.partition_key = m.partition_key AND e.execution_id = ` + memberUUIDSQL + `
	           WHERE m.partition_key = r.partition_key AND m.flow_id = r.flow_id`,
	At:        "r.requested_at_ms",
	Inclusive: true,
	ID:        Key{"r.flow_id", "uuid"},
	Index:     "ffreconcile_cancel_backlog_requested_idx",
}

// BacklogOutcome is what DrainCancelBacklog did with a header.
type BacklogOutcome int

// Backlog outcomes.
const (
	// BacklogDrained: members were cancelled where still live and acked
	// (Acked, BadMembers); the header was deleted when none was left
	// (HeaderDeleted), else its remaining members wait for the next tick.
	BacklogDrained BacklogOutcome = iota + 1
	// BacklogEmpty: the header had no member left; it was deleted.
	BacklogEmpty
	// BacklogFlowMissing: the flow is not in ff_flow_core; the header and
	// all its members were deleted, nothing cancelled (FlowFabric's
	// scanner: "nothing authoritative to ack against").
	BacklogFlowMissing
	// BacklogNotDue: the header's grace is not over under the lock;
	// nothing changed.
	BacklogNotDue
	// BacklogGone: the header no longer exists; nothing changed.
	BacklogGone
	// BacklogOutsideTenant: with a tenant filter, none of the header's
	// members' executions passes it; nothing changed.
	BacklogOutsideTenant
)

func (o BacklogOutcome) String() string {
	return outcomeName(o, "BacklogOutcome", "drained", "empty", "flow_missing", "not_due", "gone", "outside_tenant")
}

// BacklogResult says what DrainCancelBacklog did.
type BacklogResult struct {
	Outcome BacklogOutcome
	// DeadlineMs is when the header's grace ended, as read under its lock
	// (its lateness is measured from it); 0 when it is gone.
	DeadlineMs int64
	// Members is the number of member rows taken this pass (at most
	// CancelBacklogMembers).
	Members int
	// Cancelled is the number of live members cancelled; LeasesRevoked
	// of those whose current attempt held a lease.
	Cancelled, LeasesRevoked int
	// Acked is the number of member rows deleted, bad ones included
	// (for BacklogFlowMissing: every member row of the flow).
	Acked int
	// BadMembers are member ids that are not wire ids of the partition:
	// deleted, each named in a warning.
	BadMembers []string
	// LeftOutsideTenant is the number of members left as they were: their
	// execution is of another tenant or missing, under a tenant filter.
	LeftOutsideTenant int
	// HeaderDeleted: the header was deleted (no member left).
	HeaderDeleted bool
	// RawFieldsMalformed counts cancelled members whose raw_fields is not
	// a JSON object: last_mutation_at was not set and raw_fields was kept
	// (FlowFabric's jsonb_set would fail the whole cancel, every time).
	RawFieldsMalformed int
}

// Changed reports whether the pass changed anything.
func (r BacklogResult) Changed() bool {
	switch r.Outcome {
	case BacklogEmpty, BacklogFlowMissing:
		return true
	case BacklogDrained:
		return r.Acked > 0 || r.HeaderDeleted
	}
	return false
}

// BacklogCancelSource is the cancelled_by a drained member gets:
// FlowFabric's scanner cancels with CancelSource::OperatorOverride.
const BacklogCancelSource = "operator_override"

// BacklogDefaultReason is the reason a member is cancelled with when
// neither the header nor the flow has one (FlowFabric's scanner's
// default).
const BacklogDefaultReason = "flow_cancelled"

// cancelBacklogMembersSQL cancels the live executions among $2 (locked
// by the caller, of the tenant) exactly as FlowFabric's operator cancel
// does (cancel_execution_once, operator.rs:96-282, with source
// operator_override): lifecycle 'cancelled' (Postgres' canonical literal),
// unowned, not_applicable, public and attempt state 'cancelled',
// terminal_at_ms, cancellation_reason and cancelled_by only where NULL,
// raw_fields.last_mutation_at; the current attempt, when it holds a lease
// (a non-empty worker_instance_id), released (epoch + 1, terminal_at_ms,
// outcome 'cancelled') with a 'revoked' lease event carrying the
// execution's namespace and instance tag (lease_event::emit). An execution
// already terminal or cancelled is left: FlowFabric answers it as already
// cancelled, or with a Validation error, both of which its scanner acks.
// $1 partition, $3 now, $4 reason, $5 source. Index: each table's primary
// key.
const cancelBacklogMembersSQL = `
WITH cur AS (
    SELECT e.execution_id, e.attempt_index, e.raw_fields
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id = ANY($2::uuid[])
       AND e.lifecycle_phase NOT IN ('terminal', 'cancelled')
), lease AS (
    SELECT a.execution_id, a.attempt_index
      FROM ff_attempt a JOIN cur ON a.execution_id = cur.execution_id AND a.attempt_index = cur.attempt_index
     WHERE a.partition_key = $1 AND a.worker_instance_id IS NOT NULL AND a.worker_instance_id <> ''
), ec AS (
    UPDATE ff_exec_core e
       SET lifecycle_phase     = 'cancelled',
           ownership_state     = 'unowned',
           eligibility_state   = 'not_applicable',
           public_state        = 'cancelled',
           attempt_state       = 'cancelled',
           terminal_at_ms      = COALESCE(e.terminal_at_ms, $3),
           cancellation_reason = COALESCE(e.cancellation_reason, $4),
           cancelled_by        = COALESCE(e.cancelled_by, $5),
           raw_fields          = CASE WHEN jsonb_typeof(e.raw_fields) = 'object'
                                      THEN jsonb_set(e.raw_fields, '{last_mutation_at}', to_jsonb($3::bigint::text))
                                      ELSE e.raw_fields END
      FROM cur
     WHERE e.partition_key = $1 AND e.execution_id = cur.execution_id
    RETURNING e.execution_id, jsonb_typeof(e.raw_fields) = 'object' AS raw_ok
), att AS (
    UPDATE ff_attempt a
       SET worker_instance_id  = NULL,
           lease_expires_at_ms = NULL,
           lease_epoch         = a.lease_epoch + 1,
           terminal_at_ms      = $3,
           outcome             = 'cancelled'
      FROM lease
     WHERE a.partition_key = $1 AND a.execution_id = lease.execution_id AND a.attempt_index = lease.attempt_index
    RETURNING a.execution_id
), ev AS (
    INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
    SELECT att.execution_id::text, NULL, 'revoked', $3, $1::int,
           cur.raw_fields->>'namespace', cur.raw_fields->'tags'->>'cairn.instance_id'
      FROM att JOIN cur ON cur.execution_id = att.execution_id
     ORDER BY att.execution_id
    RETURNING 1
)
SELECT ec.raw_ok, att.execution_id IS NOT NULL
  FROM ec LEFT JOIN att ON att.execution_id = ec.execution_id`

// DrainCancelBacklog drains one cancel backlog header in one transaction,
// as FlowFabric's Valkey cancel_reconciler does a flow of its backlog
// (cancel_reconciler.rs:196-400) and with FlowFabric's Postgres statements:
//
//   - the header is locked (FOR UPDATE); gone, or (under filter f) with no
//     member of f's tenant, or its grace not over at nowMs
//     (COALESCE(grace_until_ms, requested_at_ms + graceMs) <= nowMs), it
//     changes nothing;
//   - a flow missing from ff_flow_core: the header and all its members are
//     deleted;
//   - else up to CancelBacklogMembers members (of f's tenant, and those
//     that are not wire ids) are locked, oldest id first; none: the header
//     is deleted;
//   - their executions are locked (FOR NO KEY UPDATE, as FlowFabric's
//     cancel), the live ones cancelled (cancelBacklogMembersSQL) with the
//     header's reason (else the flow's cancel_reason, else
//     BacklogDefaultReason), and every member taken acked as
//     ack_cancel_member does: its row deleted, and the header when none is
//     left. A member whose execution is missing is acked (FlowFabric's
//     NotFound is ack-worthy) unless f is set (it passes no filter); a
//     member id that is not a wire id is deleted and reported.
//
// A second call finds the header gone, or only the members the first left;
// a member FlowFabric cancelled meanwhile is acked without a second cancel
// or lease event. Lock order: header, members, executions, attempts;
// FlowFabric's own cancel takes execution then attempt.
func DrainCancelBacklog(ctx context.Context, db Beginner, partition int16, flowID string, graceMs, nowMs int64, f Filter) (BacklogResult, error) {
	var r BacklogResult
	err := inTx(ctx, db, func(tx pgx.Tx) (bool, error) {
		r = BacklogResult{}
		var (
			requested int64
			grace     *int64
			reason    string
		)
		err := tx.QueryRow(ctx, `
			SELECT requested_at_ms, grace_until_ms, reason FROM ff_cancel_backlog
			 WHERE partition_key = $1 AND flow_id = $2::uuid
			   FOR UPDATE`, partition, flowID).Scan(&requested, &grace, &reason)
		if errors.Is(err, pgx.ErrNoRows) {
			r.Outcome = BacklogGone
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("lock header: %w", err)
		}
		r.DeadlineMs = requested + graceMs
		if grace != nil {
			r.DeadlineMs = *grace
		}
		if !f.Empty() {
			p := params{partition, flowID}
			var in bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ff_cancel_backlog r
				 WHERE r.partition_key = $1 AND r.flow_id = $2::uuid`+CancelBacklogHeaders.tenantCond(&p, f)+`)`, p...).Scan(&in); err != nil {
				return false, fmt.Errorf("check tenant: %w", err)
			}
			if !in {
				r.Outcome = BacklogOutsideTenant
				return false, nil
			}
		}
		if r.DeadlineMs > nowMs {
			r.Outcome = BacklogNotDue
			return false, nil
		}

		var flowReason *string
		err = tx.QueryRow(ctx, `SELECT raw_fields->>'cancel_reason' FROM ff_flow_core WHERE partition_key = $1 AND flow_id = $2::uuid`,
			partition, flowID).Scan(&flowReason)
		if errors.Is(err, pgx.ErrNoRows) {
			tag, err := tx.Exec(ctx, `DELETE FROM ff_cancel_backlog_member WHERE partition_key = $1 AND flow_id = $2::uuid`, partition, flowID)
			if err != nil {
				return false, fmt.Errorf("delete members of a missing flow: %w", err)
			}
			r.Acked = int(tag.RowsAffected())
			if err := deleteHeader(ctx, tx, partition, flowID, &r); err != nil {
				return false, err
			}
			r.Outcome = BacklogFlowMissing
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("read flow: %w", err)
		}
		if reason == "" && flowReason != nil {
			reason = *flowReason
		}
		if reason == "" {
			reason = BacklogDefaultReason
		}

		p := params{partition, flowID, CancelBacklogMembers}
		rows, err := tx.Query(ctx, `
			SELECT m.execution_id FROM ff_cancel_backlog_member m
			 WHERE m.partition_key = $1 AND m.flow_id = $2::uuid`+memberInTenantSQL(&p, f)+`
			 ORDER BY m.execution_id
			 LIMIT $3
			   FOR UPDATE OF m`, p...)
		if err != nil {
			return false, fmt.Errorf("lock members: %w", err)
		}
		members, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return false, fmt.Errorf("lock members: %w", err)
		}
		r.Members = len(members)
		if len(members) == 0 {
			if err := deleteHeader(ctx, tx, partition, flowID, &r); err != nil {
				return false, err
			}
			r.Outcome = BacklogEmpty
			return r.HeaderDeleted, nil
		}

		var ids []string
		wire := map[string]string{} // uuid → member id
		for _, m := range members {
			if id, ok := ParseWireID(m, partition); ok {
				ids = append(ids, id)
				wire[id] = m
			} else {
				r.BadMembers = append(r.BadMembers, m)
			}
		}
		ack := append([]string(nil), r.BadMembers...)
		if len(ids) > 0 {
			lp := params{partition, ids}
			pass := "true"
			if !f.Empty() {
				pass = "true" + f.sql(&lp, "e", false)
			}
			rows, err := tx.Query(ctx, `
				SELECT e.execution_id::text, `+pass+`
				  FROM ff_exec_core e
				 WHERE e.partition_key = $1 AND e.execution_id = ANY($2::uuid[])
				 ORDER BY e.execution_id
				   FOR NO KEY UPDATE OF e`, lp...)
			if err != nil {
				return false, fmt.Errorf("lock member executions: %w", err)
			}
			found := map[string]bool{}
			var in []string
			var (
				id string
				ok bool
			)
			if _, err := pgx.ForEachRow(rows, []any{&id, &ok}, func() error {
				found[id] = ok
				if ok {
					in = append(in, id)
				}
				return nil
			}); err != nil {
				return false, fmt.Errorf("lock member executions: %w", err)
			}
			for _, id := range ids {
				pass, exists := found[id]
				if pass || (!exists && f.Empty()) {
					ack = append(ack, wire[id])
				} else {
					r.LeftOutsideTenant++
				}
			}
			if len(in) > 0 {
				rows, err := tx.Query(ctx, cancelBacklogMembersSQL, partition, in, nowMs, reason, BacklogCancelSource)
				if err != nil {
					return false, fmt.Errorf("cancel members: %w", err)
				}
				var rawOK, revoked bool
				if _, err := pgx.ForEachRow(rows, []any{&rawOK, &revoked}, func() error {
					r.Cancelled++
					if !rawOK {
						r.RawFieldsMalformed++
					}
					if revoked {
						r.LeasesRevoked++
					}
					return nil
				}); err != nil {
					return false, fmt.Errorf("cancel members: %w", err)
				}
			}
		}
		if len(ack) > 0 {
			tag, err := tx.Exec(ctx, `
				DELETE FROM ff_cancel_backlog_member
				 WHERE partition_key = $1 AND flow_id = $2::uuid AND execution_id = ANY($3::text[])`, partition, flowID, ack)
			if err != nil {
				return false, fmt.Errorf("ack members: %w", err)
			}
			r.Acked = int(tag.RowsAffected())
		}
		if err := deleteHeader(ctx, tx, partition, flowID, &r); err != nil {
			return false, err
		}
		r.Outcome = BacklogDrained
		return r.Changed(), nil
	})
	if err != nil {
		return BacklogResult{}, fmt.Errorf("drain cancel backlog %d/%s: %w", partition, flowID, err)
	}
	return r, nil
}

// memberInTenantSQL is the condition on the backlog member aliased m that
// it is f's to act on: every member without a filter; with one, a member
// whose execution passes it, or whose id is not a wire id (deleted as
// FlowFabric's scanner does a malformed one).
func memberInTenantSQL(p *params, f Filter) string {
	if f.Empty() {
		return ""
	}
	return ` AND (` + memberUUIDSQL + ` IS NULL OR EXISTS (SELECT 1 FROM ff_exec_core e
	          WHERE e.partition_key = m.partition_key AND e.execution_id = ` + memberUUIDSQL + f.sql(p, "e", false) + `))`
}

// deleteHeader is ack_cancel_member's second statement: the header is
// deleted when no member row of its flow is left.
func deleteHeader(ctx context.Context, tx pgx.Tx, partition int16, flowID string, r *BacklogResult) error {
	tag, err := tx.Exec(ctx, `
		DELETE FROM ff_cancel_backlog
		 WHERE partition_key = $1 AND flow_id = $2::uuid
		   AND NOT EXISTS (SELECT 1 FROM ff_cancel_backlog_member WHERE partition_key = $1 AND flow_id = $2::uuid)`,
		partition, flowID)
	if err != nil {
		return fmt.Errorf("delete header: %w", err)
	}
	r.HeaderDeleted = tag.RowsAffected() > 0
	return nil
}

// CancelBacklogDepth counts the cancel backlog's headers that pass f (a
// header with a member of f's tenant), up to capRows: FlowFabric's
// ff_cancel_backlog_depth gauge (the flows of its backlog), which its
// Postgres backend never sets. Index: as CancelBacklogHeaders.
func CancelBacklogDepth(ctx context.Context, db DB, f Filter, capRows int) (int64, error) {
	p := params{capRows}
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM ff_cancel_backlog r WHERE true`+
		CancelBacklogHeaders.tenantCond(&p, f)+` LIMIT $1) x`, p...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count cancel backlog: %w", err)
	}
	return n, nil
}
