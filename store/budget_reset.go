package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// DueBudgetResets are budget policies whose next reset time has come, with
// FlowFabric's inclusive `<=`. Budgets belong to no tenant. Index:
// ff_budget_policy_reset_due_idx (partition_key, next_reset_at_ms) WHERE
// next_reset_at_ms IS NOT NULL.
var DueBudgetResets = &Due{
	What:      "budgets due for a reset",
	From:      "ff_budget_policy r",
	At:        "r.next_reset_at_ms",
	Inclusive: true,
	ID:        Key{"r.budget_id", "text"},
	Index:     "ff_budget_policy_reset_due_idx",
}

// BudgetResetResult says what ResetBudgets did to one budget.
type BudgetResetResult struct {
	// Applied: under its row lock the budget's reset was still due; every
	// usage row of the budget is zeroed, its breach cleared and its next
	// reset scheduled. False: it was reset or rescheduled meanwhile:
	// nothing changed.
	Applied bool
	// NextResetAtMs is the next reset now scheduled (0: none, the interval
	// being absent, zero or negative: the budget was reset once).
	NextResetAtMs int64
	// UsageRows is the number of usage rows zeroed.
	UsageRows int64
	// IntervalMalformed holds policy_json.reset_interval_ms as stored when
	// it is present but not a whole number that fits 64 bits, which
	// FlowFabric reads as 0 (reset once, no next reset).
	IntervalMalformed string
	// DeadlineMs is the reset time the policy had under its lock (the one
	// this reset served), when Applied: the deadline its lateness is
	// measured from.
	DeadlineMs int64
}

// resetBudgetsSQL is FlowFabric's budget_reset_reconciler_apply as one
// statement, for a batch of budgets of one partition ($2 ids, in order; $3
// now), run in a SERIALIZABLE transaction as FlowFabric runs it (usage
// reports are serializable too; a reset in READ COMMITTED would break their
// guarantees):
//   - pol locks each policy FOR NO KEY UPDATE and re-checks that its reset
//     is due, reading the reset time it had (lateness is measured from
//     it); reads reset_interval_ms as FlowFabric's as_i64 does (a JSON
//     integer in the 64-bit range, else 0), the cast in a CASE branch;
//   - usage zeroes every dimension row of the budget;
//   - up clears the breach and schedules the next reset at now + interval
//     (capped at the largest bigint, where FlowFabric's addition would fail
//     the row at every tick), or none when the interval is not positive.
//     breach_count, soft_breach_count, policy_json, the scope and
//     enforcement_mode are left as they are.
//
// A concurrent change of a row it read makes the transaction fail with a
// serialization error; the batch runs again (retrySerialization, with the
// same now: the pause is milliseconds) and re-decides on what committed,
// and a failure that outlasts the retries fails the row job, which River
// retries. FlowFabric has one transaction per budget, so a conflict there
// costs one budget; here it costs the batch one more run.
//
// Index: each table's primary key (usage rows by its prefix).
const resetBudgetsSQL = `
WITH input AS (
    SELECT i.budget_id, i.ord FROM unnest($2::text[]) WITH ORDINALITY AS i(budget_id, ord)
), pol AS (
    SELECT p.budget_id, p.next_reset_at_ms AS due_at_ms, COALESCE(v.n, 0) AS reset_interval,
           CASE WHEN q.ri IS NOT NULL AND v.n IS NULL THEN q.ri::text END AS bad_interval
      FROM ff_budget_policy p
     CROSS JOIN LATERAL (SELECT p.policy_json->'reset_interval_ms' AS ri) q
     CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(q.ri) = 'number' AND (q.ri #>> '{}') ~ '^-?[0-9]{1,19}$'
                                     THEN CASE WHEN (q.ri #>> '{}')::numeric BETWEEN -9223372036854775808 AND 9223372036854775807
                                               THEN (q.ri #>> '{}')::bigint END END AS n) v
     WHERE p.partition_key = $1 AND p.budget_id IN (SELECT budget_id FROM input)
       AND p.next_reset_at_ms IS NOT NULL AND p.next_reset_at_ms <= $3
     ORDER BY p.budget_id
       FOR NO KEY UPDATE OF p
), usage AS (
    UPDATE ff_budget_usage u
       SET current_value = 0, last_reset_at_ms = $3, updated_at_ms = $3
      FROM pol
     WHERE u.partition_key = $1 AND u.budget_id = pol.budget_id
    RETURNING u.budget_id
), up AS (
    UPDATE ff_budget_policy p
       SET last_breach_at_ms = NULL,
           last_breach_dim = NULL,
           updated_at_ms = $3,
           next_reset_at_ms = CASE WHEN pol.reset_interval > 0
                                   THEN LEAST($3::numeric + pol.reset_interval, 9223372036854775807)::bigint END
      FROM pol
     WHERE p.partition_key = $1 AND p.budget_id = pol.budget_id
    RETURNING p.budget_id, p.next_reset_at_ms, pol.bad_interval, pol.due_at_ms
)
SELECT up.budget_id IS NOT NULL,
       COALESCE(up.next_reset_at_ms, 0),
       (SELECT count(*) FROM usage WHERE usage.budget_id = i.budget_id),
       COALESCE(up.bad_interval, ''),
       COALESCE(up.due_at_ms, 0)
  FROM input i
  LEFT JOIN up ON up.budget_id = i.budget_id
 ORDER BY i.ord`

// ResetBudgets resets budgets of one partition whose reset is due, as
// FlowFabric's budget_reset reconciler does, with one result per id in
// order, in one SERIALIZABLE transaction per statement. db must begin
// transactions with options (a pool). Each budget is re-checked under its
// own row lock exactly as alone; a second call finds the reset rescheduled
// (or unscheduled) and changes nothing.
func ResetBudgets(ctx context.Context, db TxBeginner, partition int16, budgetIDs []string, nowMs int64) ([]BudgetResetResult, error) {
	var r BudgetResetResult
	return batch[BudgetResetResult]{
		sql:  resetBudgetsSQL,
		args: func(round []int) []any { return []any{partition, pick(budgetIDs, round), nowMs} },
		dest: []any{&r.Applied, &r.NextResetAtMs, &r.UsageRows, &r.IntervalMalformed, &r.DeadlineMs},
		read: func() BudgetResetResult { return r },
		what: "reset budget", partition: partition,
		tx: &pgx.TxOptions{IsoLevel: pgx.Serializable},
	}.run(ctx, db, budgetIDs)
}
