package ffread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// CancelFlowArgs are ff-core's CancelFlowArgs as cancel_flow_header reads
// them.
type CancelFlowArgs struct {
	// CancellationPolicy is stored in the flow's raw_fields and the backlog
	// header (cancel_all, cancel_flow_only, cancel_pending, …).
	CancellationPolicy string
	// Reason is stored as the flow's cancel_reason, the header's reason and
	// the members' cancellation_reason (where NULL).
	Reason string
	// NowMs is args.now. 0 means the wall clock.
	NowMs int64
}

// CancelFlowHeader is ff-core's CancelFlowHeader: Cancelled (a fresh
// cancel) or AlreadyTerminal (an idempotent re-cancel).
type CancelFlowHeader struct {
	// AlreadyTerminal: the flow was already cancelled, completed or
	// failed; nothing was written.
	AlreadyTerminal bool
	// CancellationPolicy is the policy of a fresh cancel.
	CancellationPolicy string
	// StoredCancellationPolicy and StoredCancelReason are the flow's
	// raw_fields values on a re-cancel (nil when absent or not a string).
	StoredCancellationPolicy, StoredCancelReason *string
	// MemberExecutionIDs are wire ids "{fp:N}:<uuid>": on a fresh cancel
	// the members it cancelled; on a re-cancel the backlog's members not
	// yet acked, or, when none is left, every member of the flow.
	MemberExecutionIDs []string
}

// CancelFlowHeaderOp is cancel_flow_header_impl and cancel_flow_header_once
// (operator.rs:897-1140), one SERIALIZABLE transaction retried like
// CancelExecution; partition is the flow's partition (FlowFabric derives it
// from the flow id's hash and its partition config; tests name it). Under a
// lock on the flow (FOR NO KEY UPDATE):
//   - a missing flow is a NotFoundError{"flow"};
//   - a flow whose public_flow_state is cancelled, completed or failed is
//     answered AlreadyTerminal with its stored policy and reason, and the
//     ff_cancel_backlog_member rows of the flow, or, when it has none, every
//     ff_exec_core row of the flow as wire ids (so after a drain that acked
//     every member, the re-cancel lists the flow's members again);
//   - else the flow becomes cancelled (terminal_at_ms where NULL, policy and
//     reason merged into raw_fields), the backlog header is inserted
//     (requested_at_ms now, an empty requester, status 'pending', grace_until_ms
//     left NULL; ON CONFLICT DO NOTHING), the members not terminal or
//     cancelled get a member row each (their wire ids) and are flipped to
//     lifecycle, eligibility and public state 'cancelled' (terminal_at_ms,
//     cancellation_reason and cancelled_by 'cancel_flow_header' where NULL;
//     no lease released), and a flow_cancel_requested operator event is
//     written.
func CancelFlowHeaderOp(ctx context.Context, db TxDB, partition int16, flowID string, args CancelFlowArgs) (*CancelFlowHeader, error) {
	u, err := uuid.Parse(flowID)
	if err != nil {
		return nil, invalidInput("cancel_flow_header: flow_id is not a UUID: %s", flowID)
	}
	flow := u.String()
	if args.NowMs == 0 {
		args.NowMs = nowMs()
	}
	return retrySerializable(ctx, func() (*CancelFlowHeader, error) {
		return cancelFlowHeaderOnce(ctx, db, partition, flow, args)
	})
}

func cancelFlowHeaderOnce(ctx context.Context, db TxDB, partition int16, flow string, args CancelFlowArgs) (*CancelFlowHeader, error) {
	fail := func(what string, err error) error {
		return fmt.Errorf("ffread: cancel_flow_header %d/%s: %s: %w", partition, flow, what, err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fail("begin", err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		return nil, fail("set isolation", err)
	}
	var (
		state string
		raw   []byte
	)
	err = tx.QueryRow(ctx, `
        SELECT public_flow_state, raw_fields
          FROM ff_flow_core
         WHERE partition_key = $1 AND flow_id = $2
         FOR NO KEY UPDATE
        `, partition, flow).Scan(&state, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{Entity: "flow"}
	}
	if err != nil {
		return nil, fail("lock flow", err)
	}

	if state == "cancelled" || state == "completed" || state == "failed" {
		out := &CancelFlowHeader{AlreadyTerminal: true}
		var fields map[string]any
		if json.Unmarshal(raw, &fields) == nil {
			if s, ok := fields["cancellation_policy"].(string); ok {
				out.StoredCancellationPolicy = &s
			}
			if s, ok := fields["cancel_reason"].(string); ok {
				out.StoredCancelReason = &s
			}
		}
		rows, err := tx.Query(ctx, `
            SELECT execution_id
              FROM ff_cancel_backlog_member
             WHERE partition_key = $1 AND flow_id = $2
            `, partition, flow)
		if err != nil {
			return nil, fail("read backlog members", err)
		}
		members, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fail("read backlog members", err)
		}
		if len(members) == 0 {
			rows, err := tx.Query(ctx, `
                SELECT execution_id::text
                  FROM ff_exec_core
                 WHERE partition_key = $1 AND flow_id = $2
                `, partition, flow)
			if err != nil {
				return nil, fail("read flow members", err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return nil, fail("read flow members", err)
			}
			for _, id := range ids {
				members = append(members, wireID(partition, id))
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, fail("commit", err)
		}
		out.MemberExecutionIDs = members
		return out, nil
	}

	if _, err := tx.Exec(ctx, `
        UPDATE ff_flow_core
           SET public_flow_state = 'cancelled',
               terminal_at_ms    = COALESCE(terminal_at_ms, $3),
               raw_fields        = raw_fields
                                    || jsonb_build_object(
                                         'cancellation_policy', $4::text,
                                         'cancel_reason',       $5::text)
         WHERE partition_key = $1 AND flow_id = $2
        `, partition, flow, args.NowMs, args.CancellationPolicy, args.Reason); err != nil {
		return nil, fail("update ff_flow_core", err)
	}
	if _, err := tx.Exec(ctx, `
        INSERT INTO ff_cancel_backlog
            (partition_key, flow_id, requested_at_ms, requester, reason,
             cancellation_policy, status)
        VALUES ($1, $2, $3, '', $4, $5, 'pending')
        ON CONFLICT (partition_key, flow_id) DO NOTHING
        `, partition, flow, args.NowMs, args.Reason, args.CancellationPolicy); err != nil {
		return nil, fail("insert ff_cancel_backlog", err)
	}
	rows, err := tx.Query(ctx, `
        SELECT execution_id::text
          FROM ff_exec_core
         WHERE partition_key = $1 AND flow_id = $2
           AND lifecycle_phase NOT IN ('terminal','cancelled')
        `, partition, flow)
	if err != nil {
		return nil, fail("enumerate members", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail("enumerate members", err)
	}
	members := make([]string, len(ids))
	for i, id := range ids {
		members[i] = wireID(partition, id)
	}
	if len(ids) > 0 {
		if _, err := tx.Exec(ctx, `
            INSERT INTO ff_cancel_backlog_member
                (partition_key, flow_id, execution_id)
            SELECT $1, $2, eid
              FROM UNNEST($3::text[]) AS eid
            ON CONFLICT (partition_key, flow_id, execution_id) DO NOTHING
            `, partition, flow, members); err != nil {
			return nil, fail("insert ff_cancel_backlog_member", err)
		}
		if _, err := tx.Exec(ctx, `
            UPDATE ff_exec_core
               SET lifecycle_phase     = 'cancelled',
                   eligibility_state   = 'cancelled',
                   public_state        = 'cancelled',
                   terminal_at_ms      = COALESCE(terminal_at_ms, $3),
                   cancellation_reason = COALESCE(cancellation_reason, $4),
                   cancelled_by        = COALESCE(cancelled_by, 'cancel_flow_header')
             WHERE partition_key = $1 AND execution_id = ANY($2::uuid[])
            `, partition, ids, args.NowMs, args.Reason); err != nil {
			return nil, fail("cancel members", err)
		}
	}
	details, err := json.Marshal(map[string]any{
		"flow_id":             flow,
		"cancellation_policy": args.CancellationPolicy,
		"reason":              args.Reason,
		"member_count":        len(members),
	})
	if err != nil {
		return nil, fail("operator event details", err)
	}
	if err := emitOperatorEvent(ctx, tx, partition, flow, "flow_cancel_requested", details, args.NowMs); err != nil {
		return nil, fail("emit operator event", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fail("commit", err)
	}
	return &CancelFlowHeader{CancellationPolicy: args.CancellationPolicy, MemberExecutionIDs: members}, nil
}

// emitOperatorEvent is operator_event::emit, whose source is not among the
// copies: written in lease_event::emit's shape (lease_event.rs:26-79), which
// migration 0010 says the operator outbox mirrors: one ff_operator_event row
// with the namespace and instance tag of the execution named id, NULL when
// there is none (a flow id names none).
func emitOperatorEvent(ctx context.Context, tx pgx.Tx, partition int16, id, eventType string, details []byte, occurredAtMs int64) error {
	_, err := tx.Exec(ctx, "INSERT INTO ff_operator_event "+
		"(execution_id, event_type, details, occurred_at_ms, partition_key, namespace, instance_tag) "+
		"SELECT $1::text, $2::text, $3::jsonb, $4::bigint, $5::int4, "+
		"raw_fields->>'namespace', raw_fields->'tags'->>'cairn.instance_id' "+
		"FROM ff_exec_core WHERE partition_key = $5 AND execution_id = $6::uuid "+
		"UNION ALL "+
		"SELECT $1, $2, $3, $4, $5, NULL, NULL "+
		"WHERE NOT EXISTS (SELECT 1 FROM ff_exec_core WHERE partition_key = $5 AND execution_id = $6::uuid)",
		id, eventType, string(details), occurredAtMs, int32(partition), id)
	return err
}

// AckCancelMember is ack_cancel_member_impl and ack_cancel_member_once
// (operator.rs:1152-1217), one SERIALIZABLE transaction retried like
// CancelExecution: the member row (memberWireID, the wire id as stored) is
// deleted, then, in a second statement, the header when no member of the
// flow is left. No outbox event.
func AckCancelMember(ctx context.Context, db TxDB, partition int16, flowID, memberWireID string) error {
	u, err := uuid.Parse(flowID)
	if err != nil {
		return invalidInput("ack_cancel_member: flow_id is not a UUID: %s", flowID)
	}
	flow := u.String()
	_, err = retrySerializable(ctx, func() (struct{}, error) {
		fail := func(what string, err error) (struct{}, error) {
			return struct{}{}, fmt.Errorf("ffread: ack_cancel_member %d/%s %s: %s: %w", partition, flow, memberWireID, what, err)
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			return fail("begin", err)
		}
		defer rollback(ctx, tx)
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
			return fail("set isolation", err)
		}
		if _, err := tx.Exec(ctx, `
        DELETE FROM ff_cancel_backlog_member
         WHERE partition_key = $1
           AND flow_id       = $2
           AND execution_id  = $3
        `, partition, flow, memberWireID); err != nil {
			return fail("delete member", err)
		}
		if _, err := tx.Exec(ctx, `
        DELETE FROM ff_cancel_backlog
         WHERE partition_key = $1
           AND flow_id       = $2
           AND NOT EXISTS (
             SELECT 1 FROM ff_cancel_backlog_member
              WHERE partition_key = $1 AND flow_id = $2
           )
        `, partition, flow); err != nil {
			return fail("delete header", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fail("commit", err)
		}
		return struct{}{}, nil
	})
	return err
}

// retrySerializable is retry_serializable (operator.rs:532-556): up to
// maxSerializableAttempts runs, 5 then 10 ms apart, on a serialization
// failure or deadlock, then ErrRetryExhausted.
func retrySerializable[T any](ctx context.Context, once func() (T, error)) (T, error) {
	var zero T
	for attempt := range maxSerializableAttempts {
		v, err := once()
		if err == nil {
			return v, nil
		}
		if !retryable(err) {
			return zero, err
		}
		if attempt+1 < maxSerializableAttempts {
			select {
			case <-time.After(time.Duration(5<<attempt) * time.Millisecond):
			case <-ctx.Done():
				return zero, ctx.Err()
			}
		}
	}
	return zero, ErrRetryExhausted
}
