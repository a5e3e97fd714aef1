package ffread

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// CancelExecutionArgs are ff-core's CancelExecutionArgs as the Postgres
// cancel_execution reads them (it ignores lease_id: Postgres has no stable
// lease id column).
type CancelExecutionArgs struct {
	// Reason is stored as cancellation_reason unless one is already set.
	Reason string
	// Source is the CancelSource wire string: operator_override,
	// lease_holder, flow_cascade, system_timeout or any custom string.
	// "" means operator_override, CancelSource's default. It is stored as
	// cancelled_by unless one is already set.
	Source string
	// LeaseEpoch is the caller's lease fence; it is required (and must
	// equal the current attempt's lease_epoch) when Source is not
	// operator_override and the current attempt holds a lease.
	LeaseEpoch *uint64
	// NowMs is args.now: terminal_at_ms, last_mutation_at and the lease
	// event's time. 0 means the wall clock.
	NowMs int64
}

// CancelExecutionResult says what CancelExecution found. FlowFabric
// returns the same CancelExecutionResult::Cancelled { public_state:
// Cancelled } whether it cancelled the execution now or found it already
// cancelled; AlreadyCancelled and LeaseRevoked are ours, to tell the two
// apart.
type CancelExecutionResult struct {
	// PublicState is always "cancelled".
	PublicState string
	// AlreadyCancelled: the execution was already terminal (lifecycle
	// 'terminal' or 'cancelled') with public_state 'cancelled'; nothing
	// was written.
	AlreadyCancelled bool
	// LeaseRevoked: the current attempt held a lease, which was released
	// (epoch bumped, outcome 'cancelled') with a 'revoked' lease event.
	LeaseRevoked bool
}

// CancelExecution is the operator cancel, cancel_execution_impl and
// cancel_execution_once (operator.rs:88-309): one SERIALIZABLE transaction,
// retried up to three times (after 5 and 10 ms) on a serialization failure
// or deadlock, then ErrRetryExhausted. Under a lock on the execution
// (FOR NO KEY UPDATE) joined to its current attempt:
//   - a missing row is a NotFoundError{"execution"};
//   - lifecycle_phase 'terminal' or 'cancelled' changes nothing: already
//     cancelled when public_state is 'cancelled', else an InvalidInput
//     error "cancel_execution: execution_id=…: already terminal in state
//     '<public_state>'";
//   - the lease is active when the current attempt's worker_instance_id is
//     non-empty; then, unless the source is operator_override, a missing
//     LeaseEpoch is an InvalidInput error and one that differs from the
//     attempt's lease_epoch is ErrStaleLease;
//   - the row becomes lifecycle 'cancelled' (Postgres' own terminal
//     literal, not 'terminal'), unowned, not_applicable, public and attempt
//     state 'cancelled', with terminal_at_ms, cancellation_reason and
//     cancelled_by set only where NULL (COALESCE), and
//     raw_fields.last_mutation_at now;
//   - when the lease was active the current attempt is released (worker
//     instance and lease expiry NULL, lease_epoch + 1, terminal_at_ms now,
//     outcome 'cancelled') and a 'revoked' ff_lease_event is written. An
//     attempt without a lease is not touched, and no lease event is written.
//
// It writes no ff_operator_event (the table's event types are
// priority_changed, replayed and flow_cancel_requested) and no completion
// event.
func CancelExecution(ctx context.Context, db TxDB, partition int16, executionID string, args CancelExecutionArgs) (*CancelExecutionResult, error) {
	k, err := parseExec("cancel_execution", partition, executionID)
	if err != nil {
		return nil, err
	}
	if args.Source == "" {
		args.Source = "operator_override"
	}
	if args.NowMs == 0 {
		args.NowMs = nowMs()
	}
	for attempt := range maxSerializableAttempts {
		res, err := cancelExecutionOnce(ctx, db, k, args)
		if err == nil {
			return res, nil
		}
		if !retryable(err) {
			return nil, err
		}
		if attempt+1 < maxSerializableAttempts {
			select {
			case <-time.After(time.Duration(5<<attempt) * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return nil, ErrRetryExhausted
}

// cancelExecutionOnce is cancel_execution_once (operator.rs:96-282).
func cancelExecutionOnce(ctx context.Context, db TxDB, k execKey, args CancelExecutionArgs) (*CancelExecutionResult, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, dbErr("cancel_execution", k, err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		return nil, dbErr("cancel_execution: set isolation", k, err)
	}
	res, err := cancelExecutionInTx(ctx, tx, k, args)
	if err != nil || res.AlreadyCancelled {
		return res, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, dbErr("cancel_execution: commit", k, err)
	}
	return res, nil
}

// CancelExecutionTx runs cancel_execution_once's statements (see
// CancelExecution) inside tx, which the caller begins (SERIALIZABLE, as
// FlowFabric does, or not) and commits, with no retry: for tests that hold
// FlowFabric's cancel open, its execution locked, while another
// transaction runs. On an error or an execution already cancelled the
// caller should roll back, as FlowFabric does.
func CancelExecutionTx(ctx context.Context, tx pgx.Tx, partition int16, executionID string, args CancelExecutionArgs) (*CancelExecutionResult, error) {
	k, err := parseExec("cancel_execution", partition, executionID)
	if err != nil {
		return nil, err
	}
	if args.Source == "" {
		args.Source = "operator_override"
	}
	if args.NowMs == 0 {
		args.NowMs = nowMs()
	}
	return cancelExecutionInTx(ctx, tx, k, args)
}

// cancelExecutionInTx is cancel_execution_once's body between its BEGIN and
// COMMIT.
func cancelExecutionInTx(ctx context.Context, tx pgx.Tx, k execKey, args CancelExecutionArgs) (*CancelExecutionResult, error) {
	var (
		phase, publicState string
		attemptIndex       int32
		workerInstanceID   *string
		leaseEpoch         *int64
	)
	err := tx.QueryRow(ctx, `
        SELECT ec.lifecycle_phase,
               ec.public_state,
               ec.attempt_index,
               a.worker_instance_id,
               a.lease_epoch
          FROM ff_exec_core ec
          LEFT JOIN ff_attempt a
            ON a.partition_key = ec.partition_key
           AND a.execution_id  = ec.execution_id
           AND a.attempt_index = ec.attempt_index
         WHERE ec.partition_key = $1 AND ec.execution_id = $2
         FOR NO KEY UPDATE OF ec
        `, k.part, k.id).Scan(&phase, &publicState, &attemptIndex, &workerInstanceID, &leaseEpoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{Entity: "execution"}
	}
	if err != nil {
		return nil, dbErr("cancel_execution", k, err)
	}

	if phase == "terminal" || phase == "cancelled" {
		if publicState == "cancelled" {
			return &CancelExecutionResult{PublicState: "cancelled", AlreadyCancelled: true}, nil
		}
		return nil, invalidInput("cancel_execution: execution_id=%s: already terminal in state '%s'", k.wire, publicState)
	}

	leaseActive := workerInstanceID != nil && *workerInstanceID != ""
	if args.Source != "operator_override" && leaseActive {
		if args.LeaseEpoch == nil {
			return nil, invalidInput("cancel_execution: execution_id=%s: lease_epoch required when source != operator_override and execution is active", k.wire)
		}
		expected := int64(math.MaxInt64)
		if *args.LeaseEpoch <= math.MaxInt64 {
			expected = int64(*args.LeaseEpoch)
		}
		var stored int64
		if leaseEpoch != nil {
			stored = *leaseEpoch
		}
		if stored != expected {
			return nil, ErrStaleLease
		}
	}

	if _, err := tx.Exec(ctx, `
        UPDATE ff_exec_core
           SET lifecycle_phase     = 'cancelled',
               ownership_state     = 'unowned',
               eligibility_state   = 'not_applicable',
               public_state        = 'cancelled',
               attempt_state       = 'cancelled',
               terminal_at_ms      = COALESCE(terminal_at_ms, $3),
               cancellation_reason = COALESCE(cancellation_reason, $4),
               cancelled_by        = COALESCE(cancelled_by, $5),
               raw_fields          = jsonb_set(raw_fields,
                                               '{last_mutation_at}',
                                               to_jsonb($3::text))
         WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id, args.NowMs, args.Reason, args.Source); err != nil {
		return nil, dbErr("cancel_execution: update ff_exec_core", k, err)
	}

	if leaseActive {
		if _, err := tx.Exec(ctx, `
            UPDATE ff_attempt
               SET worker_instance_id   = NULL,
                   lease_expires_at_ms  = NULL,
                   lease_epoch          = lease_epoch + 1,
                   terminal_at_ms       = $4,
                   outcome              = 'cancelled'
             WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3
            `, k.part, k.id, attemptIndex, args.NowMs); err != nil {
			return nil, dbErr("cancel_execution: release ff_attempt lease", k, err)
		}
		if err := emitLeaseEvent(ctx, tx, k, nil, leaseEventRevoked, args.NowMs); err != nil {
			return nil, err
		}
	}

	return &CancelExecutionResult{PublicState: "cancelled", LeaseRevoked: leaseActive}, nil
}
