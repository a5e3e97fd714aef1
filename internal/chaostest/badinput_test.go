package chaostest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// check reports whether a row reached its final state, and what it looks
// like when it has not.
type check func(ctx context.Context, db *pgxpool.Pool) (bool, string)

// badCase is one malformed row, seeded with a good row of the same kind in
// the same partition.
type badCase struct {
	name string
	// warn is a substring of the warning the fleet must log with the
	// row's id as an attribute; "" when the row is handled without one.
	warn string
	// seed inserts the rows in partition p and returns the id a warning
	// names (execution id, or flow id for cancel groups) and the checks
	// of the malformed row's and the good row's final states.
	seed func(t *testing.T, db *testdb.DB, p int16) (id string, bad, good check)
}

func badCases() []badCase {
	past := func() *int64 { return fftest.Ms(store.NowMs() - 5000) }
	str := fftest.Str
	return []badCase{
		{
			name: "MemberMapArray",
			warn: "member_map was not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutAutoResume), MemberMap: []int{1, 2}})
				return id, resumedWith(p, id, `{"__timeout__": [`), goodSuspension(t, db, p)
			},
		},
		{
			name: "MemberMapString",
			warn: "member_map was not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutAutoResume), MemberMap: "approval"})
				return id, resumedWith(p, id, `{"__timeout__": [`), goodSuspension(t, db, p)
			},
		},
		{
			name: "MemberMapTimeoutNotArray",
			warn: "__timeout__ is not an array",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutAutoResume), MemberMap: map[string]any{"__timeout__": "soon"}})
				return id, resumedWith(p, id, `{"__timeout__": "soon"}`), goodSuspension(t, db, p)
			},
		},
		{
			name: "MembersNotUUIDs",
			warn: "members that are not UUIDs",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				return badGroup(t, db, p, "not-a-uuid", "0b9f7c1e-0000-4000-8000-00000000000g")
			},
		},
		{
			name: "MembersEmptyStrings",
			warn: "members that are not UUIDs",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				return badGroup(t, db, p, "", "")
			},
		},
		{
			// The column's type allows NULL elements, FlowFabric never
			// writes them; the group must still be drained.
			name: "MembersWithNULLs",
			warn: "members that are not UUIDs",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				flow, bad, good := badGroup(t, db, p)
				if _, err := db.Pool.Exec(context.Background(), `UPDATE ff_edge_group
					   SET cancel_siblings_pending_members = array_prepend(NULL::text, cancel_siblings_pending_members)
					 WHERE partition_key = $1 AND flow_id = $2`, p, flow); err != nil {
					t.Fatal(err)
				}
				return flow, bad, good
			},
		},
		{
			name: "RawFieldsWithoutNamespaceOrTags",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, RawFields: map[string]any{}})
				fftest.InsertAttempt(t, db.Pool, p, id, 0, past())
				return id, released(p, id, "runnable", 1), goodLease(t, db, p)
			},
		},
		{
			name: "RawFieldsTagsNotObject",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, map[string]any{"namespace": "n", "tags": "cairn.instance_id=x"})
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutExpire)})
				return id, timedOut(p, id, "suspension_timeout_expire", "expired", 1), goodSuspension(t, db, p)
			},
		},
		{
			name: "RawFieldsArrayOnLease",
			warn: "raw_fields is not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, RawFields: []string{"a"}})
				fftest.InsertAttempt(t, db.Pool, p, id, 0, past())
				return id, released(p, id, "runnable", 1), goodLease(t, db, p)
			},
		},
		{
			name: "RawFieldsStringOnSuspension",
			warn: "raw_fields is not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, "raw")
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutCancel)})
				return id, timedOut(p, id, "suspension_timeout_cancel", "cancelled", 1), goodSuspension(t, db, p)
			},
		},
		{
			name: "RawFieldsJSONNullOnSibling",
			warn: "raw_fields is not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				flow, bad, good := badGroup(t, db, p)
				if _, err := db.Pool.Exec(context.Background(), `UPDATE ff_exec_core SET raw_fields = 'null'::jsonb
					 WHERE partition_key = $1 AND flow_id = $2 AND lifecycle_phase = 'active'`, p, flow); err != nil {
					t.Fatal(err)
				}
				return flow, bad, good
			},
		},
		{
			name: "RawFieldsArrayOnDelayed",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				e := fftest.Delayed(p, store.NowMs()-5000)
				e.RawFields = []int{}
				id := fftest.InsertExec(t, db.Pool, e)
				return id, promoted(p, id), goodDelayed(t, db, p)
			},
		},
		{
			name: "UnknownTimeoutBehavior",
			warn: "unknown suspension timeout behaviour",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str("hibernate")})
				return id, timedOut(p, id, "suspension_timeout_fail", "expired", 1), goodSuspension(t, db, p)
			},
		},
		{
			name: "EmptyTimeoutBehavior",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str("")})
				return id, timedOut(p, id, "suspension_timeout_fail", "expired", 1), goodSuspension(t, db, p)
			},
		},
		{
			name: "NULLTimeoutBehavior",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := suspendedExec(t, db, p, nil)
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past()})
				return id, timedOut(p, id, "suspension_timeout_fail", "expired", 1), goodSuspension(t, db, p)
			},
		},
		{
			name: "AttemptWithoutExecution",
			warn: "execution row is missing",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.NewUUID()
				fftest.InsertAttempt(t, db.Pool, p, id, 0, past())
				return id, released(p, id, "", 1), goodLease(t, db, p)
			},
		},
		{
			name: "SuspensionWithoutExecution",
			warn: "row is missing",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.NewUUID()
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutFail)})
				return id, timedOut(p, id, "", "", 0), goodSuspension(t, db, p)
			},
		},
		{
			name: "PendingWithoutEdgeGroup",
			warn: "without an edge group",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				flow, down := fftest.NewUUID(), fftest.NewUUID()
				fftest.InsertPendingCancel(t, db.Pool, p, flow, down, store.NowMs()-1000)
				return flow, pendingGone(p, flow, down), goodLease(t, db, p)
			},
		},
		{
			// 'cancelled' and 'blocked' are no lifecycle phases of
			// FlowFabric's: a sibling already 'cancelled' is left as it
			// is, a 'blocked' one is cancelled like a live one.
			name: "SiblingPhasesOutsideEnum",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				flow := fftest.NewUUID()
				down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "runnable",
					OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending"})
				cancelled := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "cancelled"})
				blocked := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "blocked"})
				fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: true,
					Members: []string{cancelled, blocked}})
				fftest.InsertPendingCancel(t, db.Pool, p, flow, down, store.NowMs()-1000)
				return flow, allOf(pendingGone(p, flow, down), phase(p, cancelled, "cancelled", nil),
					phase(p, blocked, "terminal", str(store.SiblingQuorumSatisfied))), goodGroup(t, db, p)
			},
		},
		{
			name: "LeaseOnBlockedExecution",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "blocked"})
				fftest.InsertAttempt(t, db.Pool, p, id, 0, past())
				return id, released(p, id, "blocked", 1), goodLease(t, db, p)
			},
		},
		{
			// Not due for promotion (the phase is not runnable): skipped.
			name: "DelayedBlockedExecution",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				e := fftest.Delayed(p, store.NowMs()-5000)
				e.LifecyclePhase = "blocked"
				id := fftest.InsertExec(t, db.Pool, e)
				return id, phase(p, id, "blocked", nil), goodDelayed(t, db, p)
			},
		},
		{
			// A suspension left behind by a cancel: the execution is not
			// suspended, so it is left as it is (still cancelled, no event)
			// and only the suspension's timeout is cleared.
			name: "SuspensionOfCancelledExecution",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "cancelled", OwnershipState: "unowned",
					PublicState: "cancelled", AttemptState: "cancelled"})
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: past(),
					Behavior: str(store.TimeoutExpire)})
				return id, timeoutCleared(p, id, "cancelled"), goodSuspension(t, db, p)
			},
		},
		{
			// Leased for minutes, so only the deadline reconciler acts.
			name: "RawFieldsArrayPastDeadline",
			warn: "raw_fields is not a JSON object",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, RawFields: []int{1}, DeadlineAtMs: past()})
				fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(store.NowMs()+10*60_000))
				return id, phase(p, id, "terminal", nil), goodDeadline(t, db, p)
			},
		},
		{
			name: "WaitpointWithoutExecution",
			warn: "whose execution row is missing",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertWaitpoint(t, db.Pool, fftest.Waitpoint{Partition: p, ExecutionID: fftest.NewUUID(), ExpiresAtMs: past()})
				return id, waitpointClosed(p, id), goodWaitpoint(t, db, p)
			},
		},
		{
			// Budgets live in 32 partitions (--budget-partition-count).
			name: "BudgetIntervalNotANumber",
			warn: "reset_interval_ms is not a whole number",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				p %= workers.DefaultBudgetPartitionCount
				id := fftest.InsertBudget(t, db.Pool, fftest.Budget{Partition: p, Policy: map[string]any{"reset_interval_ms": "soon"},
					NextResetAtMs: past()})
				fftest.InsertBudgetUsage(t, db.Pool, p, id, "tokens", 5)
				return id, budgetReset(p, id, false), goodBudget(t, db, p)
			},
		},
		{
			// now + TTL overflows a bigint: never stale, never an error.
			name: "WorkerTTLOverflowing",
			seed: func(t *testing.T, db *testdb.DB, p int16) (string, check, check) {
				id := fftest.InsertWorker(t, db.Pool, fftest.Worker{Partition: p, Namespace: "ns", LastHeartbeatMs: 1,
					TTLMs: math.MaxInt64})
				return id, workerKept(p, id), goodWorker(t, db, p)
			},
		},
	}
}

// TestBadInput runs one fleet (every reconciler, 1 s ticks) against
// malformed rows, each next to a good row of its kind, and checks that each
// malformed row is handled (or skipped) with a warning naming it where one
// is due, that every good row proceeds, and that every row job ends
// completed (or cancelled/discarded with its reason), none left to retry.
func TestBadInput(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	cases := badCases()
	type seeded struct {
		id        string
		bad, good check
	}
	rows := make([]seeded, len(cases))
	for i, c := range cases {
		id, bad, good := c.seed(t, db, int16(10+i))
		rows[i] = seeded{id, bad, good}
	}

	ctx := context.Background()
	pool, err := openTestPool(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	warnings := &warnLog{}
	logger := slog.New(&warnHandler{log: warnings, next: fleettest.Logger(t).Handler()})
	fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(fleettest.DefaultOn()...), Logger: logger})

	// Wait for every row, good and bad, then judge each case.
	deadline := time.Now().Add(45 * time.Second)
	pendingCases := func() []string {
		var out []string
		for i, r := range rows {
			if ok, _ := r.bad(ctx, pool); !ok {
				out = append(out, cases[i].name)
			} else if ok, _ := r.good(ctx, pool); !ok {
				out = append(out, cases[i].name+" (good row)")
			}
		}
		return out
	}
	for left := pendingCases(); len(left) > 0 && time.Now().Before(deadline); left = pendingCases() {
		time.Sleep(250 * time.Millisecond)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ok, status := rows[i].bad(ctx, pool); !ok {
				t.Errorf("malformed row %s not handled: %s", rows[i].id, status)
			}
			if ok, status := rows[i].good(ctx, pool); !ok {
				t.Errorf("good row next to it did not proceed: %s", status)
			}
			if c.warn == "" {
				return
			}
			if !warnings.has(c.warn, rows[i].id) {
				t.Errorf("no warning containing %q with %s as an attribute; warnings: %s", c.warn, rows[i].id, warnings.dump())
			}
		})
	}

	// Row jobs settle: completed, or cancelled/discarded with their
	// reason; none waits to retry.
	var unsettled []string
	for {
		unsettled = unsettledRowJobs(t, ctx, pool)
		if len(unsettled) == 0 || time.Now().After(deadline.Add(15*time.Second)) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, u := range unsettled {
		t.Errorf("row job not settled: %s", u)
	}
	var panics int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE errors::text LIKE '%panic%'`).Scan(&panics); err != nil {
		t.Fatal(err)
	}
	if panics > 0 {
		t.Errorf("%d jobs recorded a panic", panics)
	}
	// The fleet is still alive: ticks keep completing.
	fleettest.WaitFor(t, fleettest.Patient, "a tick completed after the sweep", func() (bool, string) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind LIKE 'ff.%.tick'
			AND state = 'completed' AND finalized_at > now() - interval '3 seconds'`).Scan(&n)
		return err == nil && n > 0, fleettest.Statusf("%d recent ticks (%v)", n, err)
	})
}

// unsettledRowJobs lists row jobs that are not completed, and cancelled or
// discarded ones that carry no reason.
func unsettledRowJobs(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `
		SELECT id, kind, state::text, attempt, max_attempts, args::text, COALESCE(errors[cardinality(errors)]->>'error', '')
		  FROM river.river_job
		 WHERE kind = ANY($1) AND state <> 'completed'
		 ORDER BY id`, rowKinds)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var id int64
		var kind, state, args, lastErr string
		var attempt, maxAttempts int
		if err := rows.Scan(&id, &kind, &state, &attempt, &maxAttempts, &args, &lastErr); err != nil {
			t.Fatal(err)
		}
		if (state == "cancelled" || state == "discarded") && lastErr != "" {
			continue
		}
		out = append(out, fmt.Sprintf("job %d %s %s %s, attempt %d of %d, last error %q", id, kind, state, args, attempt, maxAttempts, lastErr))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ---- seeding ----

// suspendedExec inserts a suspended execution; raw nil keeps fftest's
// default raw_fields.
func suspendedExec(t *testing.T, db *testdb.DB, p int16, raw any) string {
	t.Helper()
	return fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
		PublicState: "suspended", AttemptState: "attempt_interrupted", RawFields: raw, Namespace: "ns"})
}

// seedGroup seeds a flagged group with one live sibling plus the extra
// member strings; the check wants it drained with the sibling cancelled.
func seedGroup(t *testing.T, db *testdb.DB, p int16, extra ...string) (string, check) {
	t.Helper()
	flow := fftest.NewUUID()
	down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "runnable",
		OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending"})
	sib := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow})
	fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: true,
		Members: append(slices.Clone(extra), sib)})
	fftest.InsertPendingCancel(t, db.Pool, p, flow, down, store.NowMs()-1000)
	return flow, allOf(pendingGone(p, flow, down), phase(p, sib, "terminal", fftest.Str(store.SiblingQuorumSatisfied)))
}

// badGroup seeds a group with the extra member strings and a good group
// beside it.
func badGroup(t *testing.T, db *testdb.DB, p int16, extra ...string) (string, check, check) {
	t.Helper()
	flow, bad := seedGroup(t, db, p, extra...)
	return flow, bad, goodGroup(t, db, p)
}

func goodLease(t *testing.T, db *testdb.DB, p int16) check {
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: "ns"})
	fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(store.NowMs()-5000))
	return released(p, id, "runnable", 1)
}

func goodSuspension(t *testing.T, db *testdb.DB, p int16) check {
	id := suspendedExec(t, db, p, nil)
	fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(store.NowMs() - 5000),
		Behavior: fftest.Str(store.TimeoutCancel)})
	return timedOut(p, id, "suspension_timeout_cancel", "cancelled", 1)
}

func goodDelayed(t *testing.T, db *testdb.DB, p int16) check {
	return promoted(p, fftest.InsertExec(t, db.Pool, fftest.Delayed(p, store.NowMs()-5000)))
}

func goodGroup(t *testing.T, db *testdb.DB, p int16) check {
	_, c := seedGroup(t, db, p)
	return c
}

func goodDeadline(t *testing.T, db *testdb.DB, p int16) check {
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: "ns", DeadlineAtMs: fftest.Ms(store.NowMs() - 5000)})
	fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(store.NowMs()+10*60_000))
	return phase(p, id, "terminal", nil)
}

func goodWaitpoint(t *testing.T, db *testdb.DB, p int16) check {
	exec := suspendedExec(t, db, p, nil)
	fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: exec, TimeoutAtMs: fftest.Ms(store.NowMs() + 10*60_000)})
	return waitpointClosed(p, fftest.InsertWaitpoint(t, db.Pool, fftest.Waitpoint{Partition: p, ExecutionID: exec,
		Key: "approval", ExpiresAtMs: fftest.Ms(store.NowMs() - 5000)}))
}

func goodBudget(t *testing.T, db *testdb.DB, p int16) check {
	id := fftest.InsertBudget(t, db.Pool, fftest.Budget{Partition: p, Policy: map[string]any{"reset_interval_ms": 60_000},
		NextResetAtMs: fftest.Ms(store.NowMs() - 5000)})
	fftest.InsertBudgetUsage(t, db.Pool, p, id, "tokens", 5)
	return budgetReset(p, id, true)
}

func goodWorker(t *testing.T, db *testdb.DB, p int16) check {
	id := fftest.InsertWorker(t, db.Pool, fftest.Worker{Partition: p, Namespace: "ns", LastHeartbeatMs: store.NowMs() - 60_000})
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var left, swept int
		err := db.QueryRow(ctx, `SELECT
			  (SELECT count(*) FROM ff_worker_registry WHERE namespace = 'ns' AND worker_instance_id = $1),
			  (SELECT count(*) FROM ff_worker_registry_event WHERE namespace = 'ns' AND worker_instance_id = $1
			      AND event_kind = 'ttl_swept')`, id).Scan(&left, &swept)
		if err != nil {
			return false, err.Error()
		}
		return left == 0 && swept == 1, fmt.Sprintf("worker %d/%s: %d registrations, %d ttl_swept events", p, id, left, swept)
	}
}

// ---- checks ----

func waitpointClosed(p int16, id string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ff_waitpoint_pending WHERE partition_key = $1 AND waitpoint_id = $2`,
			p, id).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("waitpoint %d/%s still pending", p, id)
	}
}

// budgetReset: the budget's usage is zeroed, with a next reset scheduled
// when next (else none).
func budgetReset(p int16, id string, next bool) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var value int64
		var nextAt *int64
		err := db.QueryRow(ctx, `SELECT u.current_value, b.next_reset_at_ms FROM ff_budget_policy b
			 JOIN ff_budget_usage u USING (partition_key, budget_id) WHERE b.partition_key = $1 AND b.budget_id = $2`,
			p, id).Scan(&value, &nextAt)
		if err != nil {
			return false, err.Error()
		}
		return value == 0 && (nextAt != nil) == next && (nextAt == nil || *nextAt > store.NowMs()),
			fmt.Sprintf("budget %d/%s: usage %d, next reset %s", p, id, value, deref(nextAt))
	}
}

// workerKept: the registration is still there, without events.
func workerKept(p int16, id string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var left, events int
		err := db.QueryRow(ctx, `SELECT
			  (SELECT count(*) FROM ff_worker_registry WHERE partition_key = $1 AND worker_instance_id = $2),
			  (SELECT count(*) FROM ff_worker_registry_event WHERE worker_instance_id = $2)`, p, id).Scan(&left, &events)
		if err != nil {
			return false, err.Error()
		}
		return left == 1 && events == 0, fmt.Sprintf("worker %d/%s: %d registrations, %d events", p, id, left, events)
	}
}

func allOf(checks ...check) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		for _, c := range checks {
			if ok, status := c(ctx, db); !ok {
				return false, status
			}
		}
		return true, ""
	}
}

// released: the attempt's lease is released with lease expiry's outcome,
// the execution is in wantPhase ("" when it has no row), and events expired
// lease events exist. An expired lease of an active execution is attempt
// timeout's too, but the fleet gives it to lease expiry when the execution
// declares no retries, as none of the test's executions does; attempt
// timeout's outcome (interrupted, the execution terminal) would be a
// regression of that rule.
func released(p int16, id, wantPhase string, events int) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var expires *int64
		var outcome *string
		err := db.QueryRow(ctx, `SELECT lease_expires_at_ms, outcome FROM ff_attempt
			 WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = 0`, p, id).Scan(&expires, &outcome)
		if err != nil {
			return false, fmt.Sprintf("attempt %s: %v", id, err)
		}
		if expires != nil || outcome == nil || *outcome != "lease_expired_reclaimable" {
			return false, fmt.Sprintf("attempt %s: lease %v, outcome %v; want released by lease expiry", id, deref(expires), deref(outcome))
		}
		if ok, status := phase(p, id, wantPhase, nil)(ctx, db); !ok {
			return false, status
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ff_lease_event WHERE execution_id = $1 AND event_type = 'expired'`, id).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == events, fmt.Sprintf("execution %s: %d expired lease events; want %d", id, n, events)
	}
}

// timedOut: the suspension is gone, the execution terminal with reason
// (skipped when reason is ""), and events completion events with outcome.
func timedOut(p int16, id, reason, outcome string, events int) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var exists bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ff_suspension_current WHERE partition_key = $1 AND execution_id = $2)`,
			p, id).Scan(&exists); err != nil {
			return false, err.Error()
		}
		if exists {
			return false, fmt.Sprintf("suspension %s still there", id)
		}
		if reason != "" {
			if ok, status := phase(p, id, "terminal", &reason)(ctx, db); !ok {
				return false, status
			}
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ff_completion_event WHERE partition_key = $1 AND execution_id = $2
			AND ($3 = '' OR outcome = $3)`, p, id, outcome).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == events, fmt.Sprintf("execution %s: %d completion events (%s); want %d", id, n, outcome, events)
	}
}

// resumedWith: the suspension's timeout is cleared and its member_map
// (as text) starts with prefix.
func resumedWith(p int16, id, prefix string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var timeout *int64
		var mm string
		err := db.QueryRow(ctx, `SELECT timeout_at_ms, member_map::text FROM ff_suspension_current
			 WHERE partition_key = $1 AND execution_id = $2`, p, id).Scan(&timeout, &mm)
		if err != nil {
			return false, fmt.Sprintf("suspension %s: %v", id, err)
		}
		return timeout == nil && strings.HasPrefix(mm, prefix), fmt.Sprintf("suspension %s: timeout %v, member_map %s", id, timeout, mm)
	}
}

func promoted(p int16, id string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var elig string
		var deadline *int64
		err := db.QueryRow(ctx, `SELECT eligibility_state, deadline_at_ms FROM ff_exec_core
			 WHERE partition_key = $1 AND execution_id = $2`, p, id).Scan(&elig, &deadline)
		if err != nil {
			return false, err.Error()
		}
		return elig == "eligible_now" && deadline == nil, fmt.Sprintf("execution %s: %s, deadline %v", id, elig, deadline)
	}
}

// phase: the execution is in lifecycle phase want with cancellation reason
// reason (nil: none); want "" means the row must not exist.
// timeoutCleared checks that a suspension of an execution no longer
// suspended had its timeout cleared, its execution still in phase and
// without a completion event.
func timeoutCleared(p int16, id, phaseWant string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var cleared bool
		if err := db.QueryRow(ctx, `SELECT timeout_at_ms IS NULL FROM ff_suspension_current WHERE partition_key = $1 AND execution_id = $2`,
			p, id).Scan(&cleared); err != nil {
			return false, fmt.Sprintf("suspension %s: %v", id, err)
		}
		if !cleared {
			return false, fmt.Sprintf("suspension %s: timeout not cleared", id)
		}
		if ok, status := phase(p, id, phaseWant, nil)(ctx, db); !ok {
			return false, status
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ff_completion_event WHERE partition_key = $1 AND execution_id = $2`,
			p, id).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("execution %s: %d completion events; want 0", id, n)
	}
}

func phase(p int16, id, want string, reason *string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var got string
		var gotReason *string
		err := db.QueryRow(ctx, `SELECT lifecycle_phase, cancellation_reason FROM ff_exec_core
			 WHERE partition_key = $1 AND execution_id = $2`, p, id).Scan(&got, &gotReason)
		if errors.Is(err, pgx.ErrNoRows) {
			return want == "", fmt.Sprintf("execution %s missing; want %s", id, want)
		}
		if err != nil {
			return false, err.Error()
		}
		ok := got == want && (reason == nil) == (gotReason == nil) && (reason == nil || *reason == *gotReason)
		return ok, fmt.Sprintf("execution %s: %s (reason %v); want %s (reason %v)", id, got, deref(gotReason), want, deref(reason))
	}
}

func pendingGone(p int16, flow, down string) check {
	return func(ctx context.Context, db *pgxpool.Pool) (bool, string) {
		var pending, flag bool
		err := db.QueryRow(ctx, `SELECT
			  EXISTS (SELECT 1 FROM ff_pending_cancel_groups WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3),
			  COALESCE((SELECT cancel_siblings_pending_flag FROM ff_edge_group
			             WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3), false)`, p, flow, down).Scan(&pending, &flag)
		if err != nil {
			return false, err.Error()
		}
		return !pending && !flag, fmt.Sprintf("group %s: pending row %v, flag %v", flow, pending, flag)
	}
}

func deref[T any](v *T) string {
	if v == nil {
		return "<nil>"
	}
	return fmt.Sprint(*v)
}

// ---- logs ----

// warnLog keeps the fleet's warnings with their attributes.
type warnLog struct {
	mu      sync.Mutex
	records []warnRecord
}

type warnRecord struct {
	msg   string
	attrs map[string]string
}

// has reports whether a warning containing msg carries id as an attribute
// value.
func (w *warnLog) has(msg, id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.records {
		if !strings.Contains(r.msg, msg) {
			continue
		}
		for _, v := range r.attrs {
			if v == id {
				return true
			}
		}
	}
	return false
}

func (w *warnLog) dump() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, r := range w.records {
		fmt.Fprintf(&b, "\n  %s %v", r.msg, r.attrs)
	}
	return b.String()
}

// warnHandler records warnings (and above) in log and passes every record
// on to next.
type warnHandler struct {
	log   *warnLog
	attrs []slog.Attr
	next  slog.Handler
}

func (h *warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.next.Enabled(ctx, l)
}

func (h *warnHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		rec := warnRecord{msg: r.Message, attrs: map[string]string{}}
		add := func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.Resolve().String(); return true }
		for _, a := range h.attrs {
			add(a)
		}
		r.Attrs(add)
		h.log.mu.Lock()
		h.log.records = append(h.log.records, rec)
		h.log.mu.Unlock()
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnHandler{log: h.log, attrs: append(slices.Clone(h.attrs), as...), next: h.next.WithAttrs(as)}
}

func (h *warnHandler) WithGroup(name string) slog.Handler {
	return &warnHandler{log: h.log, attrs: h.attrs, next: h.next.WithGroup(name)}
}

// TestBadConfiguration runs the real binary with a few representative bad
// settings (cmd/worker's tests cover the full list in-process): each must
// exit non-zero with one clear line on stderr that never shows the
// password.
func TestBadConfiguration(t *testing.T) {
	t.Parallel()
	const secret = "chaos-sekret-7"
	noFF := testdb.NewEmpty(t)
	// River's tables only: `worker run` must then name the missing ff_*
	// tables.
	if code, _, stderr := runBinary(t, time.Minute, "migrate", "--database-url", noFF.URL); code != 0 {
		t.Fatalf("worker migrate (River only): exit %d: %s", code, stderr)
	}
	withPassword := func(dbURL, user string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		if user == "" {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, secret)
		return u.String()
	}
	server := testdb.AdminURL()
	missingDB, err := testdb.WithDatabase(server, "ffr_chaos_no_such_db")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"UnreachableDatabase", nil, []string{"--database-url", "postgres://u:" + secret + "@127.0.0.1:1/x?connect_timeout=2"},
			1, "cannot reach database postgres://u:xxxxx@127.0.0.1:1/x"},
		{"NonexistentDatabase", nil, []string{"--database-url", withPassword(missingDB, "")},
			1, `database "ffr_chaos_no_such_db" does not exist`},
		{"NonexistentRole", nil, []string{"--database-url", withPassword(server, "ffr_chaos_no_such_role")},
			1, `role "ffr_chaos_no_such_role" does not exist`},
		{"MissingFFTables", nil, []string{"--database-url", withPassword(noFF.URL, "")},
			1, "missing tables: ff_attempt"},
		// Settings from the environment take the same path as flags.
		{"ZeroIntervalFromEnv", []string{"FF_DELAYED_PROMOTION_INTERVAL=0s", "DATABASE_URL=" + withPassword(noFF.URL, "")}, nil,
			2, "--delayed-promotion-interval 0s (environment variable FF_DELAYED_PROMOTION_INTERVAL): must be positive"},
		{"NegativeInterval", nil, []string{"--database-url", withPassword(noFF.URL, ""), "--cancel-reconcile-interval", "-2s"},
			2, "--cancel-reconcile-interval -2s: must be positive"},
		{"PartitionCountZero", []string{"FF_PARTITION_COUNT=0"}, []string{"--database-url", withPassword(noFF.URL, "")},
			2, "--partition-count 0 (environment variable FF_PARTITION_COUNT): must be at least 1"},
		{"InstanceTagWithoutEqualsFromEnv", []string{"FF_INSTANCE_TAG=cairn.instance_id", "DATABASE_URL=" + withPassword(noFF.URL, "")}, nil,
			2, "want KEY=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"run", "--http-addr", "", "--log-format", "json"}, tt.args...)
			code, stdout, stderr := runBinaryEnv(t, time.Minute, tt.env, args...)
			if code != tt.code {
				t.Errorf("exit code %d; want %d (stderr %q)", code, tt.code, stderr)
			}
			// JSON log lines ({...}) may precede it; the error is one line.
			var errLines []string
			for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if !strings.HasPrefix(line, "{") {
					errLines = append(errLines, line)
				}
			}
			if len(errLines) != 1 || !strings.HasPrefix(errLines[0], "worker run: ") || !strings.Contains(errLines[0], tt.want) {
				t.Errorf("want one line \"worker run: …%s…\" on stderr; got %q", tt.want, stderr)
			}
			for _, out := range []string{stdout, stderr} {
				if strings.Contains(out, secret) || strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
					t.Errorf("output leaks the password or a panic: %q", out)
				}
			}
		})
	}
}
