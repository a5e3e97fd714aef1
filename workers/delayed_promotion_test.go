package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestDelayedPromotionSweep: the sweep promotes every due delayed execution
// of the fleet's tenant across partitions (a backlog larger than one batch
// included) and nothing else: not another tenant's, not one still delayed,
// not an active execution past its execution deadline.
func TestDelayedPromotionSweep(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	now := store.NowMs()
	mine := func(e fftest.Exec) fftest.Exec {
		e.Namespace, e.Tags = "mine", map[string]string{"cairn.instance_id": "i-1"}
		return e
	}
	type row struct {
		p  int16
		id string
	}
	var due []row
	for _, p := range []int16{0, 1, 128, 255} {
		due = append(due, row{p, fftest.InsertExec(t, db.Pool, mine(fftest.Delayed(p, now-5000)))})
	}
	for i := range 25 { // partition 9: 25 due rows, batch 10
		due = append(due, row{9, fftest.InsertExec(t, db.Pool, mine(fftest.Delayed(9, now-int64(100+i))))})
	}
	otherTenant := fftest.InsertExec(t, db.Pool, func() fftest.Exec {
		e := fftest.Delayed(1, now-5000)
		e.Namespace = "other"
		return e
	}())
	otherTag := fftest.InsertExec(t, db.Pool, func() fftest.Exec {
		e := mine(fftest.Delayed(1, now-5000))
		e.Tags = map[string]string{"cairn.instance_id": "i-2"}
		return e
	}())
	notDue := fftest.InsertExec(t, db.Pool, mine(fftest.Delayed(1, now+3_600_000)))
	activePast := fftest.InsertExec(t, db.Pool, mine(fftest.Exec{Partition: 1, EligibilityState: "not_eligible_until_time", DeadlineAtMs: fftest.Ms(now - 5000)}))

	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(workers.DelayedPromotion),
		Filter:      store.Filter{Namespace: "mine", TagKey: "cairn.instance_id", TagValue: "i-1"},
		BatchSize:   10,
	})
	for _, r := range due {
		waitPromoted(t, db.Pool, r.p, r.id, fleettest.Patient)
	}
	ticks := f.Workers.Stats().For(workers.DelayedPromotion.Name).Ticks.Load()
	fleettest.WaitFor(t, fleettest.Patient, "two more ticks", func() (bool, string) {
		n := f.Workers.Stats().For(workers.DelayedPromotion.Name).Ticks.Load()
		return n >= ticks+2, fleettest.Statusf("%d ticks", n)
	})
	for _, id := range []string{otherTenant, otherTag, notDue} {
		if ex := fftest.ReadExec(t, db.Pool, 1, id); ex.EligibilityState != "not_eligible_until_time" || ex.DeadlineAtMs == nil {
			t.Errorf("execution %s outside the sweep was changed: %+v", id, ex)
		}
	}
	if ex := fftest.ReadExec(t, db.Pool, 1, activePast); ex.LifecyclePhase != "active" || ex.DeadlineAtMs == nil {
		t.Errorf("active execution was changed: %+v", ex)
	}
	waitApplied(t, f.Workers.Stats().For(workers.DelayedPromotion.Name), int64(len(due)))
	st := f.Workers.Stats().For(workers.DelayedPromotion.Name).Snapshot()
	if st.Applied != int64(len(due)) || st.Continuations < 2 {
		t.Errorf("stats %+v; want %d applied and at least 2 continuations", st, len(due))
	}
}

// TestAdHocPromotionInRolledBackTransactionNeverRuns: a promotion inserted
// in the caller's transaction exists only if that transaction commits.
func TestAdHocPromotionInRolledBackTransactionNeverRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	now := store.NowMs()
	rolledBack := fftest.InsertExec(t, db.Pool, fftest.Delayed(3, now-1000))
	committed := fftest.InsertExec(t, db.Pool, fftest.Delayed(3, now-1000))
	fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})
	client := insertOnlyClient(t, db.Pool)

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.InsertTx(ctx, tx, jobs.PromoteArgs{Execution: jobs.ExecutionID{Partition: 3, UUID: rolledBack}.String()}, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A committed promotion behind it runs: the fleet is working.
	res, err := client.Insert(ctx, jobs.PromoteArgs{Execution: jobs.ExecutionID{Partition: 3, UUID: committed}.String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitPromoted(t, db.Pool, 3, committed, fleettest.Patient)
	waitJobState(t, db.Pool, res.Job.ID, "completed")

	if ex := fftest.ReadExec(t, db.Pool, 3, rolledBack); ex.EligibilityState != "not_eligible_until_time" {
		t.Fatalf("rolled-back promotion ran: %+v", ex)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE kind = $1`, jobs.KindPromote); n != 1 {
		t.Fatalf("%d promote jobs in river_job; want only the committed one", n)
	}
}

// TestRawSQLBadPromoteJobIsCancelledOnce: a job inserted by a client without
// the Go hooks (here raw SQL, as a non-Go River client would) with invalid
// args is cancelled at its first attempt, with the reason in its errors, and
// never retried.
func TestRawSQLBadPromoteJobIsCancelledOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})

	tests := []struct {
		name, args, want string
	}{
		{"PartitionOutOfRange", `{"partition": 256, "execution_id": "6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"}`,
			"JobCancelError: invalid ff.delayed_promotion.promote job: promote args: partition 256 is out of range 0..255"},
		{"NotAUUID", `{"execution": "{fp:7}:not-a-uuid"}`,
			`JobCancelError: invalid ff.delayed_promotion.promote job: promote args: execution id "{fp:7}:not-a-uuid": "not-a-uuid" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{"WrongType", `{"partition": "7", "execution_id": "6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"}`,
			"JobCancelError: invalid ff.delayed_promotion.promote job: malformed JSON args: json: cannot unmarshal string into Go struct field PromoteArgs.partition of type int16"},
		{"Empty", `{}`,
			"JobCancelError: invalid ff.delayed_promotion.promote job: promote args: missing execution (or partition + execution_id)"},
	}
	ids := make([]int64, len(tests))
	for i, tt := range tests {
		ids[i] = db.InsertRawJob(t, jobs.KindPromote, jobs.QueueRows, "available", tt.args)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := waitJobState(t, db.Pool, ids[i], "cancelled")
			if j.Attempt != 1 || len(j.Errors) != 1 || j.Errors[0] != tt.want {
				t.Fatalf("job = %+v; want attempt 1 and the one error %q", j, tt.want)
			}
		})
	}
	if n := f.Workers.Stats().For(workers.DelayedPromotion.Name).Skipped.Load(); n != int64(len(tests)) {
		t.Errorf("skipped = %d; want %d", n, len(tests))
	}
}

// TestScheduledPromotionOnTimeWithoutSweep: with no sweep running, a
// promotion scheduled ("at") for the execution's delay-until promotes it
// once that time has passed, never before, whether it was inserted more
// than River's scheduler interval ahead (scheduled, then waiting for "at")
// or less (available at once, then waiting).
func TestScheduledPromotionOnTimeWithoutSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})
	client := insertOnlyClient(t, db.Pool)

	for _, ahead := range []time.Duration{2 * time.Second, jobs.RiverSchedulerInterval + 2*time.Second} {
		delayUntil := time.Now().Add(ahead).Truncate(time.Millisecond)
		id := fftest.InsertExec(t, db.Pool, fftest.Delayed(4, delayUntil.UnixMilli()))
		res, err := client.Insert(ctx, jobs.PromoteArgs{Execution: jobs.ExecutionID{Partition: 4, UUID: id}.String(), At: &delayUntil}, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantState := "available"
		if ahead > jobs.RiverSchedulerInterval {
			wantState = "scheduled"
		}
		if string(res.Job.State) != wantState {
			t.Fatalf("inserted %s ahead: job state %s; want %s", ahead, res.Job.State, wantState)
		}
		waitPromoted(t, db.Pool, 4, id, fleettest.Patient)
		// The attempt that promoted began no earlier than "at".
		var began time.Time
		if err := db.Pool.QueryRow(ctx, `SELECT attempted_at FROM river.river_job WHERE id = $1`, res.Job.ID).Scan(&began); err != nil {
			t.Fatal(err)
		}
		if began.Before(delayUntil) {
			t.Fatalf("promoting attempt began at %s, before its at %s", began, delayUntil)
		}
		t.Logf("inserted %s ahead: promoted %s after its delay-until", ahead, time.Since(delayUntil).Round(time.Millisecond))
		if j := waitJobState(t, db.Pool, res.Job.ID, "completed"); j.Attempt != 1 || j.Snoozes < 1 {
			t.Fatalf("job = %+v; want one attempt, after waiting for its at in a snooze", j)
		}
	}
}

// TestSQLPromotionOnTime: promotions enqueued through the SQL function
// ffreconcile_promote, as a service in another language does, run as Go
// clients' do. One with an "at" promotes the execution once that time has
// passed, never before, whether called more than River's scheduler
// interval ahead (scheduled) or less (available, waiting for "at"). One
// without "at" is started by the function's insert notification: there
// River polls only once a minute and the fleet has fetched already, so a
// promotion within the wait's bound was the notification's doing; a
// function that did not notify fails that case.
func TestSQLPromotionOnTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	promote := func(t *testing.T, db *testdb.DB, p int16, id string, at *time.Time) (jobID int64) {
		t.Helper()
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT job_id FROM river.ffreconcile_promote($1, $2::uuid, $3)`, p, id, at).Scan(&jobID)
		})
		if err != nil {
			t.Fatal(err)
		}
		return jobID
	}

	t.Run("At", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})
		for _, ahead := range []time.Duration{2 * time.Second, jobs.RiverSchedulerInterval + 2*time.Second} {
			delayUntil := time.Now().Add(ahead).Truncate(time.Millisecond)
			id := fftest.InsertExec(t, db.Pool, fftest.Delayed(6, delayUntil.UnixMilli()))
			jobID := promote(t, db, 6, id, &delayUntil)
			if ahead > jobs.RiverSchedulerInterval {
				if j := readJob(t, db.Pool, jobID); j.State != "scheduled" {
					t.Fatalf("called %s ahead: job state %s; want scheduled", ahead, j.State)
				}
			}
			waitPromoted(t, db.Pool, 6, id, fleettest.Patient)
			var began time.Time
			if err := db.Pool.QueryRow(ctx, `SELECT attempted_at FROM river.river_job WHERE id = $1`, jobID).Scan(&began); err != nil {
				t.Fatal(err)
			}
			if began.Before(delayUntil) {
				t.Fatalf("promoting attempt began at %s, before its at %s", began, delayUntil)
			}
			t.Logf("called %s ahead: promoted %s after its delay-until", ahead, time.Since(delayUntil).Round(time.Millisecond))
			if j := waitJobState(t, db.Pool, jobID, "completed"); j.Attempt != 1 || j.Snoozes < 1 {
				t.Fatalf("job = %+v; want one attempt, after waiting for its at in a snooze", j)
			}
		}
	})

	t.Run("NowWakesTheFleet", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep(), FetchPollInterval: time.Minute})
		// A first promotion, through River's Go client, shows the
		// fleet's producers have started and fetched.
		first := fftest.InsertExec(t, db.Pool, fftest.Delayed(6, store.NowMs()-1000))
		p := int16(6)
		if _, err := f.Client.Insert(ctx, jobs.PromoteArgs{Partition: &p, ExecutionID: first}, nil); err != nil {
			t.Fatal(err)
		}
		waitPromoted(t, db.Pool, 6, first, fleettest.Patient)

		id := fftest.InsertExec(t, db.Pool, fftest.Delayed(6, store.NowMs()-1000))
		jobID := promote(t, db, 6, id, nil)
		waitPromoted(t, db.Pool, 6, id, fleettest.Patient)
		if j := waitJobState(t, db.Pool, jobID, "completed"); j.Attempt != 1 || j.Snoozes != 0 {
			t.Fatalf("job = %+v; want completed in one attempt", j)
		}
	})
}

// TestEarlyPromotionSnoozesUntilDue: a promotion that runs before the
// execution's delay-until snoozes until it, then promotes, without a sweep.
// One whose delay-until is further than MaxPromoteSnooze completes as a
// no-op and is left to the sweep.
func TestEarlyPromotionSnoozesUntilDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})
	client := insertOnlyClient(t, db.Pool)

	delayUntil := time.Now().Add(2 * time.Second)
	soon := fftest.InsertExec(t, db.Pool, fftest.Delayed(5, delayUntil.UnixMilli()))
	far := fftest.InsertExec(t, db.Pool, fftest.Delayed(5, delayUntil.Add(2*time.Hour).UnixMilli()))
	p := int16(5)
	soonJob, err := client.Insert(ctx, jobs.PromoteArgs{Partition: &p, ExecutionID: soon}, nil)
	if err != nil {
		t.Fatal(err)
	}
	farJob, err := client.Insert(ctx, jobs.PromoteArgs{Partition: &p, ExecutionID: far}, nil)
	if err != nil {
		t.Fatal(err)
	}

	waitPromoted(t, db.Pool, 5, soon, fleettest.Patient)
	if j := waitJobState(t, db.Pool, soonJob.Job.ID, "completed"); j.Snoozes < 1 || j.Attempt != 1 {
		t.Fatalf("job = %+v; want completed after at least one snooze, in one attempt", j)
	}
	j := waitJobState(t, db.Pool, farJob.Job.ID, "completed")
	if j.Snoozes != 0 {
		t.Fatalf("far job = %+v; want no snooze", j)
	}
	if ex := fftest.ReadExec(t, db.Pool, 5, far); ex.EligibilityState != "not_eligible_until_time" {
		t.Fatalf("far execution changed: %+v", ex)
	}
}
