package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// budgetPolicyJSON reads a whole ff_budget_policy row as a JSON object
// (column name to value, numbers kept exact), so a test can check that a
// reset changed only the columns it should.
func budgetPolicyJSON(t *testing.T, db store.DB, p int16, id string) map[string]any {
	t.Helper()
	var text string
	if err := db.QueryRow(context.Background(),
		`SELECT to_jsonb(b)::text FROM ff_budget_policy b WHERE partition_key = $1 AND budget_id = $2`, p, id).Scan(&text); err != nil {
		t.Fatalf("read ff_budget_policy %d/%s: %v", p, id, err)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// budgetPartitionState is every policy and usage row of a budget partition,
// without the partition key, as text: two partitions seeded alike and
// treated alike compare equal, and a partition nothing touched compares
// equal to itself before.
func budgetPartitionState(t *testing.T, db store.DB, p int16) string {
	t.Helper()
	var policies, usage string
	if err := db.QueryRow(context.Background(), `
		SELECT COALESCE((SELECT jsonb_agg(to_jsonb(b) - 'partition_key' ORDER BY b.budget_id)
		                   FROM ff_budget_policy b WHERE b.partition_key = $1), '[]')::text,
		       COALESCE((SELECT jsonb_agg(to_jsonb(u) - 'partition_key' ORDER BY u.budget_id, u.dimensions_key)
		                   FROM ff_budget_usage u WHERE u.partition_key = $1), '[]')::text`, p).Scan(&policies, &usage); err != nil {
		t.Fatal(err)
	}
	return "policies " + policies + "\nusage " + usage
}

// jsonInt is a bigint as budgetPolicyJSON decodes it.
func jsonInt(v int64) json.Number { return json.Number(strconv.FormatInt(v, 10)) }

// isSerializationFailure reports whether err is PostgreSQL's serialization
// failure (SQLSTATE 40001).
func isSerializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// resetOne resets one budget and fails the test on an error.
func resetOne(t *testing.T, db store.TxBeginner, p int16, id string, now int64) store.BudgetResetResult {
	t.Helper()
	res, err := store.ResetBudgets(context.Background(), db, p, []string{id}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one budget", len(res))
	}
	return res[0]
}

// TestResetBudgetsResetsADueBudget: a budget whose next reset is now exactly
// (FlowFabric's <= is inclusive) is reset as budget_reset_reconciler_apply
// writes it: every usage row of the budget gets current_value 0 and
// last_reset_at_ms = updated_at_ms = now; the policy's breach is cleared,
// updated_at_ms is now and the next reset now + reset_interval_ms, and no
// other column of the policy changes (breach counts, policy_json, scope,
// enforcement mode, created_at_ms). Another budget of the partition and the
// same budget id in another partition, both due, are untouched. A second
// call is a no-op, and the next reset, run late, schedules from its own now
// (no catch-up). A regression shows as a column written that FlowFabric
// keeps (or kept that it writes), a usage row of another budget zeroed, a
// strict `<`, a second call that resets again, or a DeadlineMs other than
// the reset time the policy had under its lock.
func TestResetBudgetsResetsADueBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p, q = int64(1_700_000_000_000), int16(5), int16(6)
	const interval = int64(60_000)

	policy := map[string]any{"reset_interval_ms": interval, "limits": map[string]any{"tokens": 1000}, "name": "daily"}
	id := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: policy, NextResetAtMs: fftest.Ms(now),
		BreachCount: 4, SoftBreachCount: 2, LastBreachAtMs: fftest.Ms(now - 500), LastBreachDim: fftest.Str("tokens")})
	dims := []string{"requests", "tokens", "tokens|model=x"}
	for i, dim := range dims {
		fftest.InsertBudgetUsage(t, pool, p, id, dim, int64(100+i))
	}
	// Bystanders, due as well: another budget of the partition, and the same
	// budget id in another partition.
	other := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: policy, NextResetAtMs: fftest.Ms(now - 1),
		BreachCount: 1, LastBreachAtMs: fftest.Ms(now - 9), LastBreachDim: fftest.Str("tokens")})
	fftest.InsertBudgetUsage(t, pool, p, other, "tokens", 7)
	fftest.InsertBudget(t, pool, fftest.Budget{Partition: q, ID: id, Policy: policy, NextResetAtMs: fftest.Ms(now - 1)})
	fftest.InsertBudgetUsage(t, pool, q, id, "tokens", 9)
	bystanders := func() []any {
		return []any{fftest.ReadBudget(t, pool, p, other), fftest.ReadUsage(t, pool, p, other),
			budgetPartitionState(t, pool, q)}
	}
	bystandersBefore := bystanders()

	// The due scan agrees: due at now, not at now - 1.
	for _, c := range []struct {
		at   int64
		want int
	}{{now - 1, 1}, {now, 2}} {
		got, err := store.DueBudgetResets.Scan(ctx, pool, p, c.at, nil, 10, store.Filter{})
		if err != nil || len(got) != c.want {
			t.Fatalf("scan at %d = %+v, %v; want %d budgets", c.at, got, err, c.want)
		}
	}

	before := budgetPolicyJSON(t, pool, p, id)
	res := resetOne(t, pool, p, id, now)
	// DeadlineMs is the reset time served (seeded at now), not the next one.
	if want := (store.BudgetResetResult{Applied: true, NextResetAtMs: now + interval, UsageRows: 3, DeadlineMs: now}); res != want {
		t.Fatalf("result = %+v; want %+v", res, want)
	}
	want := maps.Clone(before)
	want["last_breach_at_ms"] = nil
	want["last_breach_dim"] = nil
	want["updated_at_ms"] = jsonInt(now)
	want["next_reset_at_ms"] = jsonInt(now + interval)
	after := budgetPolicyJSON(t, pool, p, id)
	if !reflect.DeepEqual(after, want) {
		t.Fatalf("policy row after the reset:\n got %v\nwant %v", after, want)
	}
	if after["breach_count"] != jsonInt(4) || after["soft_breach_count"] != jsonInt(2) ||
		after["scope_type"] != "flow" || after["scope_id"] != "scope-1" || after["enforcement_mode"] != "hard" {
		t.Fatalf("policy row lost a kept column: %v", after)
	}
	usage := fftest.ReadUsage(t, pool, p, id)
	if len(usage) != len(dims) {
		t.Fatalf("%d usage rows; want %d", len(usage), len(dims))
	}
	for i, u := range usage {
		if u.Dimensions != dims[i] || u.CurrentValue != 0 || u.LastResetAtMs == nil || *u.LastResetAtMs != now || u.UpdatedAtMs != now {
			t.Fatalf("usage row %d = %+v; want %s zeroed, last reset and updated at %d", i, u, dims[i], now)
		}
	}
	if got := bystanders(); !reflect.DeepEqual(got, bystandersBefore) {
		t.Fatalf("another budget changed:\n got %v\nwant %v", got, bystandersBefore)
	}

	// A second call (the job ran twice), at now or until the next reset, is
	// a no-op.
	state := budgetPartitionState(t, pool, p)
	for _, at := range []int64{now, now + interval - 1} {
		if res := resetOne(t, pool, p, id, at); res != (store.BudgetResetResult{}) {
			t.Fatalf("second call at %d = %+v; want a no-op", at, res)
		}
	}
	if got := budgetPartitionState(t, pool, p); got != state {
		t.Fatalf("a second call changed the partition:\n got %s\nwant %s", got, state)
	}

	// The next reset, run 7 ms late, schedules from its own now.
	late := now + interval + 7
	fftest.InsertBudgetUsage(t, pool, p, id, "fresh", 3)
	res = resetOne(t, pool, p, id, late)
	// Its deadline is the reset the first one scheduled, not its late now.
	if want := (store.BudgetResetResult{Applied: true, NextResetAtMs: late + interval, UsageRows: 4, DeadlineMs: now + interval}); res != want {
		t.Fatalf("next reset = %+v; want %+v", res, want)
	}
	for _, u := range fftest.ReadUsage(t, pool, p, id) {
		if u.CurrentValue != 0 || *u.LastResetAtMs != late || u.UpdatedAtMs != late {
			t.Fatalf("usage row after the next reset = %+v; want zeroed at %d", u, late)
		}
	}
	if got := bystanders(); !reflect.DeepEqual(got, bystandersBefore) {
		t.Fatalf("another budget changed:\n got %v\nwant %v", got, bystandersBefore)
	}
}

// TestResetBudgetsInterval: the next reset is now + policy_json.reset_interval_ms
// read as FlowFabric's as_i64 reads it: a JSON integer in the 64-bit range
// (as PostgreSQL returns it: jsonb stores 6e4 as 60000), else 0. Not
// positive (absent, 0, negative, or read as 0) schedules none: the budget is
// reset once and never again. A malformed value (string, float, even a whole
// one, object, array, boolean, null, a number beyond the 64-bit range) is
// reported in IntervalMalformed as stored, and the reset still happens; a
// well-formed one, or none, reports "". A next reset beyond the bigint range
// is capped at its largest value (ours: FlowFabric's addition fails the row
// at every tick). policy_json itself is never changed. A regression shows as
// a string or float read as a number, a malformed value that blocks the
// reset or goes unreported, an overflow error, or a DeadlineMs other than
// the reset time served.
func TestResetBudgetsInterval(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now, p = int64(1_700_000_000_000), int16(9)
	never := int64(0)

	tests := []struct {
		name string
		// policy is policy_json; raw, when set, is reset_interval_ms's raw
		// JSON in an object holding only it.
		policy    any
		raw       string
		next      int64 // 0: none
		malformed string
	}{
		{name: "Positive", raw: `60000`, next: now + 60_000},
		{name: "OneMs", raw: `1`, next: now + 1},
		{name: "ExponentStoredAsInteger", raw: `6e4`, next: now + 60_000},
		{name: "Absent", policy: map[string]any{"limits": map[string]any{"tokens": 5}}, next: never},
		{name: "PolicyNotAnObject", policy: []any{60000}, next: never},
		{name: "Zero", raw: `0`, next: never},
		{name: "Negative", raw: `-5`, next: never},
		{name: "SmallestBigint", raw: `-9223372036854775808`, next: never},
		{name: "LargestBigintIsCapped", raw: `9223372036854775807`, next: math.MaxInt64},
		{name: "ExactlyReachesLargestBigint", raw: strconv.FormatInt(math.MaxInt64-now, 10), next: math.MaxInt64},
		{name: "OneMsPastLargestBigintIsCapped", raw: strconv.FormatInt(math.MaxInt64-now+1, 10), next: math.MaxInt64},
		{name: "String", raw: `"60000"`, next: never, malformed: `"60000"`},
		{name: "Float", raw: `1.5`, next: never, malformed: `1.5`},
		{name: "WholeFloat", raw: `60000.0`, next: never, malformed: `60000.0`},
		{name: "Object", raw: `{"ms": 60000}`, next: never, malformed: `{"ms": 60000}`},
		{name: "Array", raw: `[60000]`, next: never, malformed: `[60000]`},
		{name: "Boolean", raw: `true`, next: never, malformed: `true`},
		{name: "Null", raw: `null`, next: never, malformed: `null`},
		{name: "BeyondInt64", raw: `9223372036854775808`, next: never, malformed: `9223372036854775808`},
		{name: "BeyondUint64", raw: `18446744073709551616`, next: never, malformed: `18446744073709551616`},
		{name: "BelowInt64", raw: `-9223372036854775809`, next: never, malformed: `-9223372036854775809`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policy := tt.policy
			if tt.raw != "" {
				policy = map[string]any{"reset_interval_ms": json.RawMessage(tt.raw)}
			}
			const due = now - 1 // the reset served, whatever the interval
			id := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: policy, NextResetAtMs: fftest.Ms(due),
				LastBreachAtMs: fftest.Ms(now - 2), LastBreachDim: fftest.Str("d")})
			fftest.InsertBudgetUsage(t, pool, p, id, "d", 42)
			policyBefore := fftest.ReadBudget(t, pool, p, id).PolicyJSON

			res := resetOne(t, pool, p, id, now)
			if want := (store.BudgetResetResult{Applied: true, NextResetAtMs: tt.next, UsageRows: 1, IntervalMalformed: tt.malformed,
				DeadlineMs: due}); res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			b := fftest.ReadBudget(t, pool, p, id)
			if (tt.next == never) != (b.NextResetAtMs == nil) || (b.NextResetAtMs != nil && *b.NextResetAtMs != tt.next) {
				t.Fatalf("next_reset_at_ms = %v; want %d (0: NULL)", b.NextResetAtMs, tt.next)
			}
			if b.PolicyJSON != policyBefore || b.UpdatedAtMs != now || b.LastBreachAtMs != nil || b.LastBreachDim != nil {
				t.Fatalf("policy = %+v; want policy_json %s kept, updated at %d, breach cleared", b, policyBefore, now)
			}
			if u := fftest.ReadUsage(t, pool, p, id); len(u) != 1 || u[0].CurrentValue != 0 {
				t.Fatalf("usage = %+v; want zeroed", u)
			}

			// Until its next reset (for ever, without one) it is not due.
			later := int64(math.MaxInt64 - 1)
			if tt.next != never {
				later = tt.next - 1
			}
			if res := resetOne(t, pool, p, id, later); res != (store.BudgetResetResult{}) {
				t.Fatalf("call at %d = %+v; want a no-op", later, res)
			}
		})
	}
}

// TestResetBudgetsNoOps: a budget not due yet (next reset one ms after now),
// one without a next reset, one that does not exist, and one that exists
// only in another partition are not reset: the result is the zero value
// (not applied, no usage rows) and no row of the partition changes, its
// breach and usage included. A regression shows as an early reset, a reset
// of an unscheduled budget, or a budget reset in the wrong partition.
func TestResetBudgetsNoOps(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(1_700_000_000_000)
	policy := map[string]any{"reset_interval_ms": 1_000}

	tests := []struct {
		name string
		// seed inserts what partition p holds and returns the budget id to
		// reset there.
		seed func(t *testing.T, p int16) string
	}{
		{name: "NotDueYet", seed: func(t *testing.T, p int16) string {
			return fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: policy, NextResetAtMs: fftest.Ms(now + 1),
				BreachCount: 3, LastBreachAtMs: fftest.Ms(now - 5), LastBreachDim: fftest.Str("tokens")})
		}},
		{name: "NoNextReset", seed: func(t *testing.T, p int16) string {
			return fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: policy,
				LastBreachAtMs: fftest.Ms(now - 5), LastBreachDim: fftest.Str("tokens")})
		}},
		{name: "Missing", seed: func(t *testing.T, p int16) string { return "budget-missing" }},
		{name: "InAnotherPartitionOnly", seed: func(t *testing.T, p int16) string {
			id := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p + 100, Policy: policy, NextResetAtMs: fftest.Ms(now - 1)})
			fftest.InsertBudgetUsage(t, pool, p+100, id, "tokens", 5)
			return id
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(20 + i)
			id := tt.seed(t, p)
			fftest.InsertBudgetUsage(t, pool, p, id, "tokens", 5) // usage rows may exist without a policy
			before, beforeOther := budgetPartitionState(t, pool, p), budgetPartitionState(t, pool, p+100)
			if res := resetOne(t, pool, p, id, now); res != (store.BudgetResetResult{}) {
				t.Fatalf("result = %+v; want a no-op", res)
			}
			if got := budgetPartitionState(t, pool, p); got != before {
				t.Fatalf("partition changed:\n got %s\nwant %s", got, before)
			}
			if got := budgetPartitionState(t, pool, p+100); got != beforeOther {
				t.Fatalf("another partition changed:\n got %s\nwant %s", got, beforeOther)
			}
		})
	}
}

// TestResetBudgetsBatch: a batch gives each budget the result it gets alone,
// in input order, and leaves the partition as one call per budget does: the
// same scenario is seeded in two partitions, reset as one batch in the
// first and budget by budget in the second. It holds a due budget with
// usage rows, one without usage rows (still reset, UsageRows 0), one not
// due, a missing one, a malformed interval, one reset once, and repeated
// ids (no-ops the second time, as a second call is). A regression shows as
// results out of order, a repeated id reset twice, a budget's usage
// counted against another, or a budget given another's DeadlineMs.
func TestResetBudgetsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, batchP, aloneP = int64(1_700_000_000_000), int16(11), int16(12)

	seed := func(p int16) {
		add := func(id string, policy any, next *int64, usage ...string) {
			fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, ID: id, Policy: policy, NextResetAtMs: next,
				BreachCount: 2, LastBreachAtMs: fftest.Ms(now - 3), LastBreachDim: fftest.Str("d")})
			for i, dim := range usage {
				fftest.InsertBudgetUsage(t, pool, p, id, dim, int64(10*(i+1)))
			}
		}
		add("a-due", map[string]any{"reset_interval_ms": 1_000}, fftest.Ms(now-10), "x", "y")
		add("b-no-usage", map[string]any{"reset_interval_ms": 2_000}, fftest.Ms(now))
		add("c-not-due", map[string]any{"reset_interval_ms": 1_000}, fftest.Ms(now+1), "x")
		add("d-malformed", map[string]any{"reset_interval_ms": "soon"}, fftest.Ms(now-1), "x")
		add("e-once", map[string]any{}, fftest.Ms(now-1), "x", "y", "z")
	}
	seed(batchP)
	seed(aloneP)

	ids := []string{"c-not-due", "a-due", "missing", "b-no-usage", "d-malformed", "a-due", "e-once", "b-no-usage", "e-once"}
	got, err := store.ResetBudgets(ctx, pool, batchP, ids, now)
	if err != nil {
		t.Fatal(err)
	}
	// DeadlineMs is each budget's own seeded reset time.
	want := []store.BudgetResetResult{
		{},
		{Applied: true, NextResetAtMs: now + 1_000, UsageRows: 2, DeadlineMs: now - 10},
		{},
		{Applied: true, NextResetAtMs: now + 2_000, DeadlineMs: now},
		{Applied: true, UsageRows: 1, IntervalMalformed: `"soon"`, DeadlineMs: now - 1},
		{}, // a-due again: rescheduled
		{Applied: true, UsageRows: 3, DeadlineMs: now - 1},
		{}, // b-no-usage again
		{}, // e-once again: unscheduled
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batch results:\n got %+v\nwant %+v", got, want)
	}
	var alone []store.BudgetResetResult
	for _, id := range ids {
		alone = append(alone, resetOne(t, pool, aloneP, id, now))
	}
	if !reflect.DeepEqual(got, alone) {
		t.Fatalf("batch results differ from one call per budget:\n batch %+v\n alone %+v", got, alone)
	}
	if b, a := budgetPartitionState(t, pool, batchP), budgetPartitionState(t, pool, aloneP); b != a {
		t.Fatalf("the batch left its partition unlike one call per budget:\n batch %s\n alone %s", b, a)
	}
	if r := fftest.ReadBudget(t, pool, batchP, "c-not-due"); r.LastBreachAtMs == nil || r.UpdatedAtMs != 1 {
		t.Fatalf("budget not due changed: %+v", r)
	}
}

// txCounter is the test database as ResetBudgets sees it (a pool that
// begins transactions with options), counting the transactions it begins.
// With interleave set, each transaction first takes its snapshot (SELECT 1)
// and interleave then runs on another connection and commits, before the
// store's statement runs: exactly the moment at which another transaction
// committing makes a SERIALIZABLE one fail to serialize, every time.
type txCounter struct {
	*pgxpool.Pool
	begun      atomic.Int32
	interleave func(ctx context.Context) error
}

func (c *txCounter) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c.begun.Add(1)
	tx, err := c.Pool.BeginTx(ctx, opts)
	if err != nil || c.interleave == nil {
		return tx, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	if err := c.interleave(ctx); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// TestResetBudgetsSerializationFailure: the reset runs in a SERIALIZABLE
// transaction, as FlowFabric's does. When another transaction changes a row
// the reset reads (reschedules the policy, records a breach, or reports
// usage) and commits while the reset waits for that row's lock, the reset's
// transaction fails to serialize and changes nothing; the store runs it
// again (a second transaction: only SQLSTATE 40001 is retried), and that
// run decides on the committed state: a rescheduled budget is left alone, a
// recorded breach count is kept, the reported usage is zeroed. A regression
// to READ COMMITTED shows as a single transaction (the statement re-checking
// under the lock instead of failing); a lost update as a committed change
// overwritten; a wrong DeadlineMs as other than the seeded reset time.
func TestResetBudgetsSerializationFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(1_700_000_000_000)

	tests := []struct {
		name string
		// change runs in the concurrent transaction ($1 partition, $2
		// budget id, $3 now).
		change string
		// want is the result of the run that follows the failed one (its
		// DeadlineMs the seeded reset time, now - 1, when applied).
		want  store.BudgetResetResult
		check func(t *testing.T, p int16, id string)
	}{
		{
			name:   "Rescheduled",
			change: `UPDATE ff_budget_policy SET next_reset_at_ms = $3::bigint + 5000, updated_at_ms = $3::bigint - 1 WHERE partition_key = $1 AND budget_id = $2`,
			want:   store.BudgetResetResult{}, // not due any more
			check: func(t *testing.T, p int16, id string) {
				b := fftest.ReadBudget(t, pool, p, id)
				if *b.NextResetAtMs != now+5000 || b.UpdatedAtMs != now-1 || b.LastBreachAtMs == nil {
					t.Fatalf("budget = %+v; want the reschedule kept, not reset", b)
				}
				if u := fftest.ReadUsage(t, pool, p, id); u[0].CurrentValue != 50 {
					t.Fatalf("usage = %+v; want 50 kept", u)
				}
			},
		},
		{
			name: "BreachRecorded",
			change: `UPDATE ff_budget_policy SET breach_count = breach_count + 1, last_breach_at_ms = $3::bigint - 1,
				last_breach_dim = 'tokens', updated_at_ms = $3::bigint - 1 WHERE partition_key = $1 AND budget_id = $2`,
			want: store.BudgetResetResult{Applied: true, NextResetAtMs: now + 60_000, UsageRows: 1, DeadlineMs: now - 1},
			check: func(t *testing.T, p int16, id string) {
				if b := fftest.ReadBudget(t, pool, p, id); b.BreachCount != 3 || b.LastBreachAtMs != nil || b.UpdatedAtMs != now {
					t.Fatalf("budget = %+v; want the committed breach count 3 kept, the breach cleared", b)
				}
			},
		},
		{
			name:   "UsageReported",
			change: `UPDATE ff_budget_usage SET current_value = current_value + 7, updated_at_ms = $3::bigint - 1 WHERE partition_key = $1 AND budget_id = $2`,
			want:   store.BudgetResetResult{Applied: true, NextResetAtMs: now + 60_000, UsageRows: 1, DeadlineMs: now - 1},
			check: func(t *testing.T, p int16, id string) {
				if u := fftest.ReadUsage(t, pool, p, id); u[0].CurrentValue != 0 || *u[0].LastResetAtMs != now {
					t.Fatalf("usage = %+v; want the reported usage zeroed by the run after it", u)
				}
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(30 + i)
			id := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: map[string]any{"reset_interval_ms": 60_000},
				NextResetAtMs: fftest.Ms(now - 1), BreachCount: 2, LastBreachAtMs: fftest.Ms(now - 100), LastBreachDim: fftest.Str("d")})
			fftest.InsertBudgetUsage(t, pool, p, id, "tokens", 50)

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := tx.Exec(ctx, tt.change, p, id, now); err != nil {
				t.Fatal(err)
			}
			db := &txCounter{Pool: pool}
			type out struct {
				res []store.BudgetResetResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := store.ResetBudgets(ctx, db, p, []string{id}, now)
				done <- out{res, err}
			}()
			waitForLockWait(t, pool, "ff_budget_policy")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case o := <-done:
				if o.err != nil {
					t.Fatal(o.err)
				}
				if len(o.res) != 1 || o.res[0] != tt.want {
					t.Fatalf("result = %+v; want [%+v]", o.res, tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("reset did not finish")
			}
			if n := db.begun.Load(); n != 2 {
				t.Fatalf("%d transactions; want 2: one that failed to serialize, one that decided", n)
			}
			tt.check(t, p, id)
		})
	}
}

// TestResetBudgetsPersistentSerializationFailure: when every run of the
// reset's transaction fails to serialize (another transaction commits a
// change to the policy row after each run took its snapshot), ResetBudgets
// gives up with an error that is a serialization failure (SQLSTATE 40001,
// for River to retry the job, FlowFabric's next tick) and changes nothing:
// the budget is exactly as the other transactions left it, usage included.
// The same call with nothing concurrent then succeeds. A regression shows
// as another error, a reset applied over a concurrent change (READ
// COMMITTED), a partial reset left behind, or that success reporting a
// DeadlineMs other than the seeded reset time.
func TestResetBudgetsPersistentSerializationFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(1_700_000_000_000), int16(3)

	id := fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, Policy: map[string]any{"reset_interval_ms": 60_000},
		NextResetAtMs: fftest.Ms(now - 1), BreachCount: 2, LastBreachAtMs: fftest.Ms(now - 100), LastBreachDim: fftest.Str("d")})
	fftest.InsertBudgetUsage(t, pool, p, id, "tokens", 50)
	fftest.InsertBudgetUsage(t, pool, p, id, "requests", 5)
	before, usageBefore := budgetPolicyJSON(t, pool, p, id), fftest.ReadUsage(t, pool, p, id)

	db := &txCounter{Pool: pool, interleave: func(ctx context.Context) error {
		_, err := pool.Exec(ctx, `UPDATE ff_budget_policy SET updated_at_ms = updated_at_ms + 1 WHERE partition_key = $1 AND budget_id = $2`, p, id)
		return err
	}}
	res, err := store.ResetBudgets(ctx, db, p, []string{id}, now)
	if !isSerializationFailure(err) {
		t.Fatalf("result = %+v, error = %v; want a serialization failure (40001)", res, err)
	}
	n := db.begun.Load()
	if n < 2 {
		t.Fatalf("%d transactions; want the failed one run again", n)
	}
	want := maps.Clone(before)
	want["updated_at_ms"] = jsonInt(1 + int64(n)) // inserted at 1, one concurrent update per run
	if got := budgetPolicyJSON(t, pool, p, id); !reflect.DeepEqual(got, want) {
		t.Fatalf("policy row after the failed reset:\n got %v\nwant %v", got, want)
	}
	if got := fftest.ReadUsage(t, pool, p, id); !reflect.DeepEqual(got, usageBefore) {
		t.Fatalf("usage after the failed reset = %+v; want %+v", got, usageBefore)
	}

	// The same call on the plain pool, nothing concurrent: it resets the
	// reset seeded at now - 1.
	if res := resetOne(t, pool, p, id, now); res != (store.BudgetResetResult{Applied: true, NextResetAtMs: now + 60_000, UsageRows: 2,
		DeadlineMs: now - 1}) {
		t.Fatalf("call with nothing concurrent = %+v; want the reset applied", res)
	}
}
