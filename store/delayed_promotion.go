package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DelayedExecutions are delayed executions (runnable +
// not_eligible_until_time) whose delay-until (deadline_at_ms) has passed,
// with the seed's `<=`.
//
// Index: ff_exec_core_deadline_idx (partition_key, deadline_at_ms) WHERE
// deadline_at_ms IS NOT NULL. The column is overloaded: it holds the
// delay-until of runnable + not_eligible_until_time rows and the execution
// deadline of active rows. The index range (partition, deadline <= now)
// therefore also returns active rows past their execution deadline, which
// the phase and eligibility conditions then filter out row by row. A probe
// or scan costs O(rows of the partition whose deadline_at_ms has passed),
// whatever their phase, and never reads rows whose deadline is still ahead.
var DelayedExecutions = &Due{
	What:      "due delayed executions",
	From:      "ff_exec_core r",
	Tenant:    true,
	At:        "r.deadline_at_ms",
	Inclusive: true,
	Where:     "r.lifecycle_phase = 'runnable' AND r.eligibility_state = 'not_eligible_until_time'",
	ID:        Key{"r.execution_id", "uuid"},
	Index:     "ff_exec_core_deadline_idx",
}

// PromoteOutcome says what PromoteDelayed did, or why it did nothing.
type PromoteOutcome string

// Outcomes of PromoteDelayed. Every outcome but PromotePromoted left the row
// unchanged.
const (
	// PromotePromoted: the execution was delayed and due under its row lock
	// and is now eligible_now with deadline_at_ms NULL.
	PromotePromoted PromoteOutcome = "promoted"
	// PromoteNotDue: the execution is delayed but its delay-until is after
	// now (or NULL, which the seed also leaves alone).
	PromoteNotDue PromoteOutcome = "not_due"
	// PromoteWrongPhase: lifecycle_phase is not runnable.
	PromoteWrongPhase PromoteOutcome = "wrong_phase"
	// PromoteWrongEligibility: runnable, but eligibility_state is not
	// not_eligible_until_time (typically already promoted).
	PromoteWrongEligibility PromoteOutcome = "wrong_eligibility"
	// PromoteMissing: no such execution.
	PromoteMissing PromoteOutcome = "missing"
	// PromoteRaced: the row qualified in the statement's snapshot, but a
	// transaction that committed while the UPDATE waited for the row lock
	// changed it so that it no longer did (typically a concurrent promotion
	// of the same execution).
	PromoteRaced PromoteOutcome = "changed_concurrently"
)

// PromoteResult is what PromoteDelayed did and, on a no-op, the row as the
// statement's snapshot saw it.
type PromoteResult struct {
	Outcome PromoteOutcome
	// LifecyclePhase, EligibilityState and DeadlineAtMs are the row's values
	// before the statement (empty and nil when the row is missing).
	LifecyclePhase   string
	EligibilityState string
	DeadlineAtMs     *int64
}

// Promoted reports whether the row was changed.
func (r PromoteResult) Promoted() bool { return r.Outcome == PromotePromoted }

// promoteSQL is the seed's promote_for_execution as one statement, for a
// batch of executions of one partition (distinct ids, in order $2):
//   - up re-checks each delay under the row lock and writes the seed's
//     values (eligibility_state eligible_now, deadline_at_ms NULL) and what
//     FlowFabric's Valkey engine writes beside them for an execution now
//     eligible (public_state waiting, blocking_reason waiting_for_worker),
//     which the seed leaves at `delayed` or the claim's `running`; the
//     attempt state is kept, as both engines keep it;
//   - cur reads the rows from the statement's snapshot so a no-op can say
//     why without a second round trip. All parts of one statement share that
//     snapshot, so cur shows a row as it was before up, not what a
//     concurrent commit that up waited for left behind (see PromoteRaced).
//
// The partition is a constant so the planner prunes to one child. Index:
// ff_exec_core's primary key.
var promoteSQL = `
WITH input AS (
    SELECT i.execution_id, i.ord FROM unnest($2::uuid[]) WITH ORDINALITY AS i(execution_id, ord)
), up AS (
    UPDATE ff_exec_core e
       SET eligibility_state = 'eligible_now',
           deadline_at_ms = NULL,
           public_state = 'waiting',
           blocking_reason = 'waiting_for_worker'
      FROM input i
     WHERE e.partition_key = $1 AND e.execution_id = i.execution_id
       AND e.lifecycle_phase = 'runnable'
       AND e.eligibility_state = 'not_eligible_until_time'
       AND e.deadline_at_ms IS NOT NULL AND e.deadline_at_ms <= $3
       AND ` + tenantSQL("e", 4) + `
    RETURNING i.ord
), cur AS (
    SELECT e.execution_id, e.lifecycle_phase, e.eligibility_state, e.deadline_at_ms
      FROM ff_exec_core e
     WHERE e.partition_key = $1 AND e.execution_id = ANY($2::uuid[])
)
SELECT up.ord IS NOT NULL, cur.lifecycle_phase, cur.eligibility_state, cur.deadline_at_ms
  FROM input i
  LEFT JOIN up ON up.ord = i.ord
  LEFT JOIN cur ON cur.execution_id = i.execution_id
 ORDER BY i.ord`

// PromoteDelayed promotes one delayed execution to eligible_now if, under its
// row lock, it is still runnable + not_eligible_until_time with a
// delay-until at or before nowMs, exactly as the seed's promote_for_execution
// does. It runs as one statement (one implicit transaction when db is a
// pool); anything else is a no-op whose reason is in the result, and a second
// call for the same execution is a no-op.
func PromoteDelayed(ctx context.Context, db DB, partition int16, executionID string, nowMs int64, f Filter) (PromoteResult, error) {
	return one(PromoteDelayedMany(ctx, db, partition, []string{executionID}, nowMs, f))
}

// PromoteDelayedMany is PromoteDelayed for several executions of one
// partition, with one result per id in order. Each row is re-checked under
// its own lock exactly as alone; an id repeated goes to a following
// statement, so it sees the first one's change as a second call would.
//
// f is the fleet's tenant filter: a row outside it is left unchanged
// (see tenantSQL).
func PromoteDelayedMany(ctx context.Context, db DB, partition int16, executionIDs []string, nowMs int64, f Filter) ([]PromoteResult, error) {
	var (
		promoted    bool
		phase, elig *string
		deadline    *int64
	)
	return batch[PromoteResult]{
		sql: promoteSQL,
		args: func(round []int) []any {
			return append([]any{partition, pick(executionIDs, round), nowMs}, f.args()...)
		},
		dest: []any{&promoted, &phase, &elig, &deadline},
		read: func() PromoteResult { return promoteOutcome(promoted, phase, elig, deadline, nowMs) },
		what: "promote delayed execution", partition: partition,
	}.run(ctx, db, executionIDs)
}

func promoteOutcome(promoted bool, phase, elig *string, deadline *int64, nowMs int64) PromoteResult {
	r := PromoteResult{DeadlineAtMs: deadline}
	if phase != nil {
		r.LifecyclePhase = *phase
	}
	if elig != nil {
		r.EligibilityState = *elig
	}
	switch {
	case promoted:
		r.Outcome = PromotePromoted
	case phase == nil:
		r.Outcome = PromoteMissing
	case r.LifecyclePhase != "runnable":
		r.Outcome = PromoteWrongPhase
	case r.EligibilityState != "not_eligible_until_time":
		r.Outcome = PromoteWrongEligibility
	case r.DeadlineAtMs == nil || *r.DeadlineAtMs > nowMs:
		r.Outcome = PromoteNotDue
	default:
		r.Outcome = PromoteRaced
	}
	return r
}

// PromotionTarget is what a promotion will find of its execution now:
// Exists false when ff_exec_core has no such row, Delayed when it is
// runnable and delayed (what a promotion acts on).
type PromotionTarget struct {
	Exists, Delayed bool
	PublicState     string
}

// ReadPromotionTarget reads the execution a promotion names, for the
// promote CLI to say when its job will change nothing. Index: ff_exec_core's
// primary key.
func ReadPromotionTarget(ctx context.Context, db DB, partition int16, executionID string) (PromotionTarget, error) {
	var t PromotionTarget
	err := db.QueryRow(ctx, `
SELECT true, lifecycle_phase = 'runnable' AND eligibility_state = 'not_eligible_until_time', public_state
  FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2::uuid`, partition, executionID).Scan(&t.Exists, &t.Delayed, &t.PublicState)
	if errors.Is(err, pgx.ErrNoRows) {
		return PromotionTarget{}, nil
	}
	if err != nil {
		return t, fmt.Errorf("read execution %d/%s: %w", partition, executionID, err)
	}
	return t, nil
}
