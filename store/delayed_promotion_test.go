package store_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

func TestPromoteDelayed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(5_000_000)

	t.Run("DueIsPromotedWithTheSeedsValuesAndItsPublicState", func(t *testing.T) {
		e := fftest.Delayed(7, now-1)
		e.Namespace, e.Tags = "tenant-a", map[string]string{"cairn.instance_id": "i-1"}
		id := fftest.InsertExec(t, pool, e)
		before := fftest.ExecJSON(t, pool, 7, id)

		res, err := store.PromoteDelayed(ctx, pool, 7, id, now, store.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != store.PromotePromoted || !res.Promoted() {
			t.Fatalf("result = %+v; want promoted", res)
		}
		after := fftest.ExecJSON(t, pool, 7, id)
		if after["eligibility_state"] != "eligible_now" || after["deadline_at_ms"] != nil {
			t.Fatalf("eligibility_state = %v, deadline_at_ms = %v; want eligible_now, NULL", after["eligibility_state"], after["deadline_at_ms"])
		}
		// The seed leaves `delayed`; FlowFabric's Valkey engine says the
		// execution waits for a worker now.
		if after["public_state"] != "waiting" || after["blocking_reason"] != "waiting_for_worker" {
			t.Fatalf("public_state = %v, blocking_reason = %v; want waiting, waiting_for_worker", after["public_state"], after["blocking_reason"])
		}
		// Everything else, the attempt state included, is as the seed
		// leaves it: untouched.
		for _, k := range []string{"eligibility_state", "deadline_at_ms", "public_state", "blocking_reason"} {
			delete(before, k)
			delete(after, k)
		}
		if !maps.EqualFunc(before, after, func(a, b any) bool { return jsonEqual(a, b) }) {
			t.Fatalf("other columns changed:\nbefore %v\nafter  %v", before, after)
		}

		// A second run (the job ran twice) changes nothing.
		res, err = store.PromoteDelayed(ctx, pool, 7, id, now+5, store.Filter{})
		if err != nil || res.Outcome != store.PromoteWrongEligibility || res.EligibilityState != "eligible_now" {
			t.Fatalf("second run = %+v, %v; want a wrong-eligibility no-op", res, err)
		}
	})

	t.Run("DeadlineEqualToNowIsDue", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Delayed(8, now))
		if res, err := store.PromoteDelayed(ctx, pool, 8, id, now, store.Filter{}); err != nil || !res.Promoted() {
			t.Fatalf("result = %+v, %v; want promoted (the seed's <=)", res, err)
		}
	})

	noops := []struct {
		name string
		exec fftest.Exec
		want store.PromoteOutcome
	}{
		{"NotDueYet", fftest.Delayed(9, now+1), store.PromoteNotDue},
		{"NullDelayUntil", func() fftest.Exec { e := fftest.Delayed(9, 0); e.DeadlineAtMs = nil; return e }(), store.PromoteNotDue},
		// An active row's deadline_at_ms is its execution deadline (the
		// overloaded column): never promoted.
		{"ActiveRowPastItsExecutionDeadline", fftest.Exec{Partition: 9, EligibilityState: "not_eligible_until_time", DeadlineAtMs: fftest.Ms(now - 10)}, store.PromoteWrongPhase},
		{"RunnableButEligibleNow", func() fftest.Exec { e := fftest.Delayed(9, now-10); e.EligibilityState = "eligible_now"; return e }(), store.PromoteWrongEligibility},
		{"RunnableButBlocked", func() fftest.Exec {
			e := fftest.Delayed(9, now-10)
			e.EligibilityState = "blocked_by_dependencies"
			return e
		}(), store.PromoteWrongEligibility},
	}
	for _, tt := range noops {
		t.Run(tt.name, func(t *testing.T) {
			id := fftest.InsertExec(t, pool, tt.exec)
			before := fftest.ExecJSON(t, pool, 9, id)
			res, err := store.PromoteDelayed(ctx, pool, 9, id, now, store.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != tt.want {
				t.Fatalf("outcome = %q (%+v); want %q", res.Outcome, res, tt.want)
			}
			if res.LifecyclePhase != tt.exec.LifecyclePhase && !(tt.exec.LifecyclePhase == "" && res.LifecyclePhase == "active") {
				t.Fatalf("reported phase %q; want the row's", res.LifecyclePhase)
			}
			if after := fftest.ExecJSON(t, pool, 9, id); !maps.EqualFunc(before, after, func(a, b any) bool { return jsonEqual(a, b) }) {
				t.Fatalf("no-op changed the row:\nbefore %v\nafter  %v", before, after)
			}
		})
	}

	t.Run("NotDueReportsTheDelayUntil", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Delayed(10, now+1234))
		res, err := store.PromoteDelayed(ctx, pool, 10, id, now, store.Filter{})
		if err != nil || res.DeadlineAtMs == nil || *res.DeadlineAtMs != now+1234 {
			t.Fatalf("result = %+v, %v; want deadline %d reported", res, err, now+1234)
		}
	})

	t.Run("Missing", func(t *testing.T) {
		res, err := store.PromoteDelayed(ctx, pool, 10, fftest.NewUUID(), now, store.Filter{})
		if err != nil || res.Outcome != store.PromoteMissing || res.LifecyclePhase != "" || res.DeadlineAtMs != nil {
			t.Fatalf("result = %+v, %v; want missing", res, err)
		}
	})

	t.Run("SamePartitionOtherExecutionUntouched", func(t *testing.T) {
		a := fftest.InsertExec(t, pool, fftest.Delayed(11, now-1))
		b := fftest.InsertExec(t, pool, fftest.Delayed(11, now-1))
		if res, err := store.PromoteDelayed(ctx, pool, 11, a, now, store.Filter{}); err != nil || !res.Promoted() {
			t.Fatalf("result = %+v, %v", res, err)
		}
		if ex := fftest.ReadExec(t, pool, 11, b); ex.EligibilityState != "not_eligible_until_time" {
			t.Fatalf("another execution was promoted: %+v", ex)
		}
	})
}

// TestPromoteRechecksUnderLock: a transaction that re-delays the execution
// holds its row when the promotion starts and commits while the promotion
// waits on the lock; the promotion sees the new delay-until and changes
// nothing, reporting the race.
func TestPromoteRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(6_000_000)
	id := fftest.InsertExec(t, pool, fftest.Delayed(12, now-1))

	redelay, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer redelay.Rollback(ctx) //nolint:errcheck
	if _, err := redelay.Exec(ctx, `UPDATE ff_exec_core SET deadline_at_ms = $1 WHERE partition_key = 12 AND execution_id = $2`,
		now+60_000, id); err != nil {
		t.Fatal(err)
	}

	type result struct {
		res store.PromoteResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := store.PromoteDelayed(ctx, pool, 12, id, now, store.Filter{})
		done <- result{res, err}
	}()
	waitForLockWait(t, pool, "ff_exec_core")
	if err := redelay.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.res.Outcome != store.PromoteRaced {
			t.Fatalf("result = %+v; want %q", r.res, store.PromoteRaced)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("promotion did not finish")
	}
	ex := fftest.ReadExec(t, pool, 12, id)
	if ex.EligibilityState != "not_eligible_until_time" || ex.DeadlineAtMs == nil || *ex.DeadlineAtMs != now+60_000 {
		t.Fatalf("exec = %+v; want the re-delay kept", ex)
	}
}

// TestPromotionScansUseTheDeadlineIndex: in a partition of 50,000
// executions whose deadline is still ahead (plus a few past theirs), the
// scan and the partition probe read the partial deadline index, touching
// only rows whose deadline has passed.
func TestPromotionScansUseTheDeadlineIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(8_000_000)
	const p = 33
	// 50,000 delayed rows not yet due, 200 active rows past their execution
	// deadline, 5 due delayed rows.
	if _, err := pool.Exec(ctx, `
		INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
		       eligibility_state, public_state, attempt_state, created_at_ms, deadline_at_ms)
		SELECT $1, gen_random_uuid(), 'default', ph, 'unowned', el, 'delayed', 'pending', 1, d
		  FROM (SELECT 'runnable' AS ph, 'not_eligible_until_time' AS el, $2::bigint + 1 + g AS d FROM generate_series(1, 50000) g
		        UNION ALL SELECT 'active', 'not_applicable', $2::bigint - g FROM generate_series(1, 200) g
		        UNION ALL SELECT 'runnable', 'not_eligible_until_time', $2::bigint - 1000 - g FROM generate_series(1, 5) g) rows`,
		p, now); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE ff_exec_core`); err != nil {
		t.Fatal(err)
	}

	ex := &explainDB{DB: pool}
	due := store.DelayedExecutions
	if _, err := due.Scan(ctx, ex, p, now, nil, 1000, store.Filter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := due.Scan(ctx, ex, p, now, &store.DueRow{AtMs: now - 1003, ID: "00000000-0000-4000-8000-000000000000"}, 1000, store.Filter{Namespace: "x", TagKey: "k", TagValue: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := due.Partitions(ctx, ex, store.NoLowerBound, now, 256, store.Filter{}); err != nil {
		t.Fatal(err)
	}
	var child string
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM ff_exec_core WHERE partition_key = $1 LIMIT 1`, p).Scan(&child); err != nil {
		t.Fatal(err)
	}
	want := "Index Scan using " + child + "_partition_key_deadline_at_ms_idx on " + child
	for i, plan := range ex.plans {
		if !strings.Contains(plan, want) {
			t.Errorf("plan %d does not read %s's deadline index:\n%s", i, child, plan)
		}
		// The probe's plan covers all 256 children; empty ones may be
		// planned as (never executed or empty) sequential scans.
		if i < 2 {
			t.Logf("plan %d:\n%s", i, plan)
			if strings.Contains(plan, "Seq Scan") {
				t.Errorf("plan %d scans sequentially:\n%s", i, plan)
			}
		}
	}
	if !strings.Contains(ex.plans[1], "deadline_at_ms >= ") {
		t.Errorf("the continuation does not start inside the index:\n%s", ex.plans[1])
	}
	// The first scan reads the 205 rows whose deadline passed, not 50,205.
	if !strings.Contains(ex.plans[0], "Rows Removed by Filter: 200") {
		t.Errorf("scan plan does not show the 200 active rows filtered after the index range:\n%s", ex.plans[0])
	}
}

// TestPromoteDelayedManyBatch: a batch gives every execution the outcome it
// would get alone, in input order, and an id repeated sees the first one's
// promotion as a second call would.
func TestPromoteDelayedManyBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(6_000_000), int16(13)

	due := fftest.InsertExec(t, pool, fftest.Delayed(p, now-10))
	due2 := fftest.InsertExec(t, pool, fftest.Delayed(p, now))
	later := fftest.InsertExec(t, pool, fftest.Delayed(p, now+1_000))
	active := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	missing := fftest.NewUUID()

	ids := []string{due, later, active, due, missing, due2}
	got, err := store.PromoteDelayedMany(ctx, pool, p, ids, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.PromoteOutcome{store.PromotePromoted, store.PromoteNotDue, store.PromoteWrongPhase,
		store.PromoteWrongEligibility, store.PromoteMissing, store.PromotePromoted}
	for i, w := range want {
		if got[i].Outcome != w {
			t.Errorf("id %d (%s) = %+v, want %s", i, ids[i], got[i], w)
		}
	}
	if d := got[1].DeadlineAtMs; d == nil || *d != now+1_000 {
		t.Fatalf("not-due result carries deadline %v, want %d", d, now+1_000)
	}
	for _, id := range []string{due, due2} {
		if ex := fftest.ReadExec(t, pool, p, id); ex.EligibilityState != "eligible_now" || ex.DeadlineAtMs != nil {
			t.Fatalf("%s not promoted: %+v", id, ex)
		}
	}
	if ex := fftest.ReadExec(t, pool, p, later); ex.EligibilityState != "not_eligible_until_time" {
		t.Fatalf("not-due execution promoted: %+v", ex)
	}
}
