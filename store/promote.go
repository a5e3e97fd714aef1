package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Delayed promotion reads ff_exec_core through the partial index
// (partition_key, deadline_at_ms) WHERE deadline_at_ms IS NOT NULL. The
// column is overloaded: it holds the delay-until of runnable +
// not_eligible_until_time rows and the execution deadline of active rows. The
// index range (partition, deadline <= now) therefore also returns active rows
// past their execution deadline, which the phase and eligibility predicates
// then filter out row by row. A promotion probe or scan costs O(rows of the
// partition whose deadline_at_ms has passed), whatever their phase, and never
// reads rows whose deadline is still ahead, however many there are.
const promotableSQL = `e.deadline_at_ms IS NOT NULL AND e.deadline_at_ms <= $2
	   AND e.lifecycle_phase = 'runnable' AND e.eligibility_state = 'not_eligible_until_time'`

// DuePromotionPartitions returns the partitions (0..partitionCount-1)
// holding at least one delayed execution (runnable +
// not_eligible_until_time) whose delay-until is at or after fromMs
// (NoLowerBound: any) and at or before horizonMs, and which passes f; a tick
// passes now plus its lookahead. One probe of ff_exec_core (partition_key,
// deadline_at_ms) per partition; see promotableSQL for what a probe reads (a
// lower bound also skips the rows whose deadline passed before it).
func DuePromotionPartitions(ctx context.Context, db DB, fromMs, horizonMs int64, partitionCount int, f Filter) ([]int16, error) {
	probe, args := promotionProbe([]any{partitionCount, horizonMs, fromMs}, f)
	parts, err := collectPartitions(db.Query(ctx, partitionsSQL(probe), args...))
	if err != nil {
		return nil, fmt.Errorf("find partitions with due delayed executions: %w", err)
	}
	return parts, nil
}

// CountDuePromotions returns, for each of parts, the number of its delayed
// executions whose delay-until is at or before nowMs and which pass f. Same
// index as DuePromotionPartitions; the cost is O(rows of parts whose
// deadline_at_ms has passed).
func CountDuePromotions(ctx context.Context, db DB, nowMs int64, parts []int16, f Filter) (map[int16]int, error) {
	return countDue(ctx, db, promotionProbe, parts, nowMs, f, "due delayed executions")
}

// promotionProbe is the delayed-promotion probe of partition s.p for
// delay-untils in [$3, $2], with f's conditions appended to args.
func promotionProbe(args []any, f Filter) (string, []any) {
	cond, args := f.sql(args)
	return `SELECT 1 FROM ff_exec_core e WHERE e.partition_key = s.p AND e.deadline_at_ms >= $3 AND ` + promotableSQL + cond, args
}

// DuePromotion is one delayed execution whose delay-until has passed.
type DuePromotion struct {
	ExecutionID  string
	DeadlineAtMs int64
}

// ScanDuePromotions returns up to limit delayed executions of one partition
// whose delay-until (deadline_at_ms) is at or before nowMs, oldest deadline
// first, then by execution id (a total order, so a scan can continue after
// any row), skipping rows that do not pass f. The `<=` is the seed's
// comparison.
//
// Index: ff_exec_core (partition_key, deadline_at_ms) WHERE deadline_at_ms IS
// NOT NULL. Postgres turns the keyset row comparison into the index bound
// deadline_at_ms >= after, so a continuation starts inside the index instead
// of re-reading the rows it already walked; the execution_id tie-break is an
// incremental sort of rows with equal deadlines.
func ScanDuePromotions(ctx context.Context, db DB, partition int16, nowMs int64, after *After, limit int, f Filter) ([]DuePromotion, error) {
	args := []any{partition, nowMs, limit}
	cond := ""
	if after != nil {
		args = append(args, after.AtMs, after.ID)
		cond = ` AND (e.deadline_at_ms, e.execution_id) > ($4, $5::uuid)`
	}
	fc, args := f.sql(args)
	rows, err := db.Query(ctx, `
		SELECT e.execution_id::text, e.deadline_at_ms
		  FROM ff_exec_core e
		 WHERE e.partition_key = $1
		   AND `+promotableSQL+cond+fc+`
		 ORDER BY e.deadline_at_ms, e.execution_id
		 LIMIT $3`, args...)
	if err != nil {
		return nil, fmt.Errorf("scan due delayed executions in partition %d: %w", partition, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DuePromotion, error) {
		var p DuePromotion
		err := r.Scan(&p.ExecutionID, &p.DeadlineAtMs)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("scan due delayed executions in partition %d: %w", partition, err)
	}
	return out, nil
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
//     values (eligibility_state eligible_now, deadline_at_ms NULL) and
//     nothing else;
//   - cur reads the rows from the statement's snapshot so a no-op can say
//     why without a second round trip. All parts of one statement share that
//     snapshot, so cur shows a row as it was before up, not what a
//     concurrent commit that up waited for left behind (see PromoteRaced).
//
// The partition is a constant so the planner prunes to one child. Index:
// ff_exec_core's primary key.
const promoteSQL = `
WITH input AS (
    SELECT i.execution_id, i.ord FROM unnest($2::uuid[]) WITH ORDINALITY AS i(execution_id, ord)
), up AS (
    UPDATE ff_exec_core e
       SET eligibility_state = 'eligible_now',
           deadline_at_ms = NULL
      FROM input i
     WHERE e.partition_key = $1 AND e.execution_id = i.execution_id
       AND e.lifecycle_phase = 'runnable'
       AND e.eligibility_state = 'not_eligible_until_time'
       AND e.deadline_at_ms IS NOT NULL AND e.deadline_at_ms <= $3
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
func PromoteDelayed(ctx context.Context, db DB, partition int16, executionID string, nowMs int64) (PromoteResult, error) {
	res, err := PromoteDelayedMany(ctx, db, partition, []string{executionID}, nowMs)
	if err != nil {
		return PromoteResult{}, err
	}
	return res[0], nil
}

// PromoteDelayedMany is PromoteDelayed for several executions of one
// partition, with one result per id in order. Each row is re-checked under
// its own lock exactly as alone; an id repeated goes to a following
// statement, so it sees the first one's change as a second call would.
func PromoteDelayedMany(ctx context.Context, db DB, partition int16, executionIDs []string, nowMs int64) ([]PromoteResult, error) {
	var (
		promoted    bool
		phase, elig *string
		deadline    *int64
	)
	return batch[PromoteResult]{
		sql:  promoteSQL,
		args: func(round []int) []any { return []any{partition, pick(executionIDs, round), nowMs} },
		dest: []any{&promoted, &phase, &elig, &deadline},
		read: func() PromoteResult { return promoteOutcome(promoted, phase, elig, deadline, nowMs) },
		what: func(round []int) string {
			if len(round) == 1 {
				return fmt.Sprintf("promote delayed execution %d/%s", partition, executionIDs[round[0]])
			}
			return fmt.Sprintf("promote %d delayed executions of partition %d", len(round), partition)
		},
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
