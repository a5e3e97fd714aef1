package ffread

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// FlowFabric's claim errors without a payload, with its Display text.
var (
	// ErrExecutionNotLeaseable is Contention(ExecutionNotLeaseable):
	// claim_execution found eligibility_state other than 'eligible_now'
	// (a scheduler's 'pending_claim' among them), or attempt_interrupted.
	ErrExecutionNotLeaseable = errors.New("contention: ExecutionNotLeaseable")
	// ErrLeaseConflict is Contention(LeaseConflict): ownership_state other
	// than 'unowned'.
	ErrLeaseConflict = errors.New("contention: LeaseConflict")
	// ErrInvalidClaimGrant is Contention(InvalidClaimGrant): no 'claim'
	// grant row for the execution, or one of another worker.
	ErrInvalidClaimGrant = errors.New("contention: InvalidClaimGrant")
	// ErrClaimGrantExpired is Contention(ClaimGrantExpired): the grant's
	// expires_at_ms is set and before now.
	ErrClaimGrantExpired = errors.New("contention: ClaimGrantExpired")
	// ErrExecutionNotActive stands for Contention(ExecutionNotActive {..}):
	// claim_execution found lifecycle_phase other than 'runnable'.
	ErrExecutionNotActive = errors.New("contention: ExecutionNotActive")
)

// IssueClaimGrant is the Postgres scheduler's grant for one execution
// already picked (scheduler.rs try_claim_in_partition, stages 1 and 5, one
// READ COMMITTED transaction): it locks the execution FOR UPDATE SKIP
// LOCKED where it is runnable and eligible_now (FlowFabric's pick, narrowed
// to this execution: false when it is not pickable, or locked), writes the
// grant as claim_grant::write_claim_grant does (grant_id the sha256 of the
// grant key, the upsert, and the raw_fields.claim_grant dual-write), and
// sets eligibility_state 'pending_claim', the only column the scheduler
// changes. The grant key is unsigned here (FlowFabric signs it with the
// waitpoint HMAC key; nothing read here checks the signature). It returns
// the grant's expiry.
func IssueClaimGrant(ctx context.Context, db TxDB, partition int16, executionID, workerID, workerInstanceID string, grantTTLms, nowMs int64) (bool, int64, error) {
	k, err := parseExec("claim_for_worker", partition, executionID)
	if err != nil {
		return false, 0, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, 0, dbErr("claim_for_worker", k, err)
	}
	defer rollback(ctx, tx)
	var picked string
	err = tx.QueryRow(ctx, `
            SELECT execution_id::text
              FROM ff_exec_core
             WHERE partition_key = $1
               AND execution_id = $2
               AND lifecycle_phase = 'runnable'
               AND eligibility_state = 'eligible_now'
             FOR UPDATE SKIP LOCKED
            `, k.part, k.id).Scan(&picked)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, dbErr("claim_for_worker", k, err)
	}
	expires := nowMs + grantTTLms
	grantKey := fmt.Sprintf("pg:{fp:%d}:%s:%d:kid:unsigned", k.part, k.id, expires)
	grantID := sha256.Sum256([]byte(grantKey))
	if _, err := tx.Exec(ctx, `
        INSERT INTO ff_claim_grant (
            partition_key, grant_id, execution_id, kind,
            worker_id, worker_instance_id, lane_id,
            capability_hash, worker_capabilities,
            route_snapshot_json, admission_summary,
            grant_ttl_ms, issued_at_ms, expires_at_ms
        ) VALUES (
            $1, $2, $3, 'claim',
            $4, $5, NULL,
            NULL, '[]'::jsonb,
            NULL, NULL,
            $6, $7, $8
        )
        ON CONFLICT (partition_key, grant_id) DO UPDATE SET
            worker_id = EXCLUDED.worker_id,
            worker_instance_id = EXCLUDED.worker_instance_id,
            grant_ttl_ms = EXCLUDED.grant_ttl_ms,
            issued_at_ms = EXCLUDED.issued_at_ms,
            expires_at_ms = EXCLUDED.expires_at_ms
        `, k.part, grantID[:], k.id, workerID, workerInstanceID, grantTTLms, nowMs, expires); err != nil {
		return false, 0, dbErr("write_claim_grant", k, err)
	}
	grantJSON, err := json.Marshal(map[string]any{"grant_key": grantKey, "worker_id": workerID,
		"worker_instance_id": workerInstanceID, "expires_at_ms": expires, "issued_at_ms": nowMs})
	if err != nil {
		return false, 0, err
	}
	if _, err := tx.Exec(ctx, `
        UPDATE ff_exec_core
           SET raw_fields = jsonb_set(
                   COALESCE(raw_fields, '{}'::jsonb),
                   '{claim_grant}',
                   $3::jsonb,
                   true)
         WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id, string(grantJSON)); err != nil {
		return false, 0, dbErr("write_claim_grant", k, err)
	}
	if _, err := tx.Exec(ctx, `
            UPDATE ff_exec_core
               SET eligibility_state = 'pending_claim'
             WHERE partition_key = $1 AND execution_id = $2
            `, k.part, k.id); err != nil {
		return false, 0, dbErr("claim_for_worker", k, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, 0, dbErr("claim_for_worker", k, err)
	}
	return true, expires, nil
}

// ClaimExecution is the typed claim_execution (typed_ops.rs:1235-1528), one
// READ COMMITTED transaction: it locks the execution (FOR UPDATE) and
// checks its gates in FlowFabric's order (missing: NotFoundError;
// lifecycle_phase not 'runnable': ErrExecutionNotActive; ownership not
// 'unowned': ErrLeaseConflict; eligibility not 'eligible_now':
// ErrExecutionNotLeaseable; attempt_state 'attempt_interrupted':
// ErrExecutionNotLeaseable), then locks the execution's 'claim' grant
// (FOR UPDATE; none or another worker's: ErrInvalidClaimGrant; expiry set
// and before now: ErrClaimGrantExpired) and consumes it: the grant rows are
// deleted, an attempt inserted at attemptIndex (the running_attempt defence
// is left out: the tests never seed it), the execution made active, leased,
// public_state 'active', with an 'acquired' lease event. It returns the new
// lease epoch.
func ClaimExecution(ctx context.Context, db TxDB, partition int16, executionID, workerID, workerInstanceID string, attemptIndex int32, leaseTTLms, nowMs int64) (int64, error) {
	k, err := parseExec("claim_execution", partition, executionID)
	if err != nil {
		return 0, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	defer rollback(ctx, tx)
	var phase, ownership, eligibility, attemptState string
	err = tx.QueryRow(ctx, `
        SELECT lifecycle_phase, ownership_state, eligibility_state,
               attempt_state
          FROM ff_exec_core
         WHERE partition_key = $1 AND execution_id = $2
         FOR UPDATE
        `, k.part, k.id).Scan(&phase, &ownership, &eligibility, &attemptState)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, &NotFoundError{Entity: "execution"}
	}
	if err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	switch {
	case phase != "runnable":
		return 0, ErrExecutionNotActive
	case ownership != "unowned":
		return 0, ErrLeaseConflict
	case eligibility != "eligible_now":
		return 0, ErrExecutionNotLeaseable
	case attemptState == "attempt_interrupted":
		return 0, ErrExecutionNotLeaseable
	}
	var grantWorker string
	var grantExpires int64
	err = tx.QueryRow(ctx, `
        SELECT worker_id, expires_at_ms
          FROM ff_claim_grant
         WHERE partition_key = $1 AND execution_id = $2 AND kind = 'claim'
         FOR UPDATE
        `, k.part, k.id).Scan(&grantWorker, &grantExpires)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && grantWorker != workerID) {
		return 0, ErrInvalidClaimGrant
	}
	if err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	if grantExpires > 0 && grantExpires < nowMs {
		return 0, ErrClaimGrantExpired
	}
	if _, err := tx.Exec(ctx, "DELETE FROM ff_claim_grant "+
		"WHERE partition_key = $1 AND execution_id = $2 AND kind = 'claim'", k.part, k.id); err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	if _, err := tx.Exec(ctx, `
        INSERT INTO ff_attempt (
            partition_key, execution_id, attempt_index,
            worker_id, worker_instance_id,
            lease_epoch, lease_expires_at_ms, started_at_ms,
            policy, raw_fields
        ) VALUES (
            $1, $2, $3,
            $4, $5,
            1, $6, $7,
            NULL,
            jsonb_build_object('attempt_type', 'initial'::text)
        )
        ON CONFLICT (partition_key, execution_id, attempt_index)
        DO UPDATE SET
            worker_id = EXCLUDED.worker_id,
            worker_instance_id = EXCLUDED.worker_instance_id,
            lease_epoch = ff_attempt.lease_epoch + 1,
            lease_expires_at_ms = EXCLUDED.lease_expires_at_ms,
            started_at_ms = COALESCE(ff_attempt.started_at_ms, EXCLUDED.started_at_ms),
            policy = EXCLUDED.policy,
            raw_fields = ff_attempt.raw_fields || EXCLUDED.raw_fields,
            terminal_at_ms = NULL,
            outcome = NULL
        `, k.part, k.id, attemptIndex, workerID, workerInstanceID, nowMs+leaseTTLms, nowMs); err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	var epoch int64
	if err := tx.QueryRow(ctx, "SELECT lease_epoch FROM ff_attempt "+
		"WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3", k.part, k.id, attemptIndex).Scan(&epoch); err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	patch, err := json.Marshal(map[string]string{"current_worker_id": workerID, "current_worker_instance_id": workerInstanceID})
	if err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `
        UPDATE ff_exec_core
           SET lifecycle_phase = 'active',
               ownership_state = 'leased',
               eligibility_state = 'not_applicable',
               attempt_state = 'running_attempt',
               public_state = 'active',
               attempt_index = $1,
               raw_fields = raw_fields || $2::jsonb
         WHERE partition_key = $3 AND execution_id = $4
        `, attemptIndex+1, string(patch), k.part, k.id); err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	if err := emitLeaseEvent(ctx, tx, k, nil, leaseEventAcquired, nowMs); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, dbErr("claim_execution", k, err)
	}
	return epoch, nil
}
