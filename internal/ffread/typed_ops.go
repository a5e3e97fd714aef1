package ffread

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ResumeExecution is the typed resume_execution (typed_ops.rs:771-905), one
// READ COMMITTED transaction. It locks the execution (FOR UPDATE): a
// missing row is a NotFoundError{"execution"}, and lifecycle_phase other
// than 'suspended' is ErrExecutionNotSuspended, so an execution a signal
// already made 'resumable' (lifecycle 'runnable') cannot be resumed here.
// It then locks the ff_suspension_current row, whose absence is
// ErrExecutionNotSuspended too. The execution becomes runnable/unowned,
// attempt_state 'attempt_interrupted', with raw_fields
// current_suspension_id and current_waitpoint_id set to "", and:
//   - resumeDelayMs > 0: eligibility 'not_eligible_until_time', blocking
//     reason 'waiting_for_resume_delay', public_state 'delayed'. No
//     deadline_at_ms is written, so nothing ever promotes the row;
//   - otherwise: 'eligible_now', 'waiting_for_worker', 'waiting'.
//
// The suspension row is deleted; its waitpoints are not. It returns the
// public state written.
func ResumeExecution(ctx context.Context, db TxDB, partition int16, executionID string, resumeDelayMs int64) (string, error) {
	k, err := parseExec("resume_execution", partition, executionID)
	if err != nil {
		return "", err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", dbErr("resume_execution", k, err)
	}
	defer rollback(ctx, tx)

	var phase string
	err = tx.QueryRow(ctx, `
        SELECT lifecycle_phase
          FROM ff_exec_core
         WHERE partition_key = $1 AND execution_id = $2
         FOR UPDATE
        `, k.part, k.id).Scan(&phase)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", &NotFoundError{Entity: "execution"}
	}
	if err != nil {
		return "", dbErr("resume_execution", k, err)
	}
	if phase != "suspended" {
		return "", ErrExecutionNotSuspended
	}

	var one int32
	err = tx.QueryRow(ctx, `
        SELECT 1 FROM ff_suspension_current
         WHERE partition_key = $1 AND execution_id = $2
         FOR UPDATE
        `, k.part, k.id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrExecutionNotSuspended
	}
	if err != nil {
		return "", dbErr("resume_execution: lock ff_suspension_current", k, err)
	}

	// resume_delay_ms is a u64 there; a negative value here counts as 0.
	eligibility, blocking, publicState := "eligible_now", "waiting_for_worker", "waiting"
	if resumeDelayMs > 0 {
		eligibility, blocking, publicState = "not_eligible_until_time", "waiting_for_resume_delay", "delayed"
	}
	patch, err := json.Marshal(map[string]string{"current_suspension_id": "", "current_waitpoint_id": ""})
	if err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `
        UPDATE ff_exec_core
           SET lifecycle_phase = 'runnable',
               ownership_state = 'unowned',
               eligibility_state = $1,
               attempt_state = 'attempt_interrupted',
               blocking_reason = $2,
               public_state = $3,
               raw_fields = raw_fields || $4::jsonb
         WHERE partition_key = $5 AND execution_id = $6
        `, eligibility, blocking, publicState, json.RawMessage(patch), k.part, k.id); err != nil {
		return "", dbErr("resume_execution: update ff_exec_core", k, err)
	}
	if _, err := tx.Exec(ctx, `
        DELETE FROM ff_suspension_current
         WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id); err != nil {
		return "", dbErr("resume_execution: delete ff_suspension_current", k, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", dbErr("resume_execution: commit", k, err)
	}
	return publicState, nil
}
