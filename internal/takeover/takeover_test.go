package takeover_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/takeover"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// runningJob inserts a job running in its attempt-th attempt, attempted by
// the given clients (the last one runs it), with metadata.
func runningJob(t *testing.T, db *testdb.DB, attempt int, attemptedBy []string, metadata string) int64 {
	t.Helper()
	// A promotion of an execution that does not exist: a no-op that
	// completes when the job runs.
	id := db.InsertRawJob(t, jobs.KindPromote, jobs.QueueRows, "available", `{"partition": 0, "execution_id": "`+fftest.NewUUID()+`"}`)
	if _, err := db.Pool.Exec(context.Background(), `
		UPDATE river.river_job SET state = 'running', attempt = $2, attempted_at = now() - interval '2 seconds',
		       attempted_by = $3, metadata = $4::jsonb
		 WHERE id = $1`, id, attempt, attemptedBy, metadata); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestTakeOver: the dead process's leadership is resigned with River's own
// notification, and each of its running jobs becomes what River's rescuer
// would make it (retried after the retry policy's delay, discarded when
// its attempts are spent, cancelled when a cancel was requested), with an
// error saying why; jobs whose current attempt is another process's are
// left alone, as are those started after the process was found dead (a
// successor's under the same client ID), and a second TakeOver changes
// nothing. A regression shows as
// a live process's job rescued (it would run twice at once), a leadership
// left in place (ticks stop until River's TTL), or a job lost.
func TestTakeOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{Schema: testdb.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	var woken []time.Time
	taker, err := takeover.New(takeover.Config{Client: client, DB: db.Pool, Logger: fleettest.Logger(t),
		Wake: func(at time.Time) { woken = append(woken, at) }})
	if err != nil {
		t.Fatal(err)
	}

	var elected time.Time
	if err := db.Pool.QueryRow(ctx, `INSERT INTO river.river_leader (leader_id, elected_at, expires_at)
		VALUES ('dead', now() - interval '3 seconds', now() + interval '1 hour') RETURNING elected_at`).Scan(&elected); err != nil {
		t.Fatal(err)
	}
	retry := runningJob(t, db, 1, []string{"dead"}, `{}`)
	spent := runningJob(t, db, jobs.RowMaxAttempts, []string{"a", "b", "c", "d", "dead"}, `{}`)
	cancel := runningJob(t, db, 2, []string{"a", "dead"}, `{"cancel_attempted_at": "2026-01-01T00:00:00Z"}`)
	others := runningJob(t, db, 1, []string{"live"}, `{}`)
	takenBefore := runningJob(t, db, 2, []string{"dead", "live"}, `{}`)
	// Started after the process was found dead: a successor's, restarted
	// under the same client ID.
	successor := runningJob(t, db, 1, []string{"dead"}, `{}`)
	if _, err := db.Pool.Exec(ctx, `UPDATE river.river_job SET attempted_at = now() WHERE id = $1`, successor); err != nil {
		t.Fatal(err)
	}
	seen := time.Now().Add(-time.Second)

	listen, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(ctx)
	if _, err := listen.Exec(ctx, `LISTEN "river.`+takeover.LeadershipTopic+`"`); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	res, err := taker.TakeOver(ctx, store.DepartedWorker{ClientID: "dead", Disconnected: true, LeaderElectedAt: elected, SeenAt: seen})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resigned || res.Retried != 1 || res.Discarded != 1 || res.Cancelled != 1 || res.More {
		t.Fatalf("TakeOver = %+v; want resigned, 1 retried, 1 discarded, 1 cancelled", res)
	}
	if n := count(t, db, `SELECT count(*) FROM river.river_leader`); n != 0 {
		t.Fatalf("river_leader rows after the resignation: %d; want 0", n)
	}
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	note, err := listen.WaitForNotification(waitCtx)
	if err != nil {
		t.Fatalf("no leadership notification: %v", err)
	}
	var payload struct {
		Action   string `json:"action"`
		LeaderID string `json:"leader_id"`
	}
	if err := json.Unmarshal([]byte(note.Payload), &payload); err != nil || payload.Action != "resigned" || payload.LeaderID != "dead" {
		t.Fatalf("notification %q; want River's resignation of dead", note.Payload)
	}

	job := func(id int64) *rivertype.JobRow {
		t.Helper()
		j, err := client.JobGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	r := job(retry)
	// River's default policy: attempt 1 retries after 1 s ± 10 %.
	if r.State != rivertype.JobStateAvailable || r.ScheduledAt.Before(before.Add(800*time.Millisecond)) ||
		r.ScheduledAt.After(time.Now().Add(1200*time.Millisecond)) || len(r.Errors) != 1 ||
		!strings.Contains(r.Errors[0].Error, "dead is gone without a clean stop") {
		t.Fatalf("retried job: state %s, scheduled %s after the takeover, errors %+v; want available about 1 s on, with the reason",
			r.State, r.ScheduledAt.Sub(before), r.Errors)
	}
	if len(woken) != 1 || !woken[0].Equal(r.ScheduledAt) {
		t.Fatalf("wake-ups %v; want one at %v", woken, r.ScheduledAt)
	}
	if j := job(spent); j.State != rivertype.JobStateDiscarded || j.FinalizedAt == nil {
		t.Fatalf("job with its attempts spent: %s; want discarded", j.State)
	}
	if j := job(cancel); j.State != rivertype.JobStateCancelled || j.FinalizedAt == nil {
		t.Fatalf("job with a cancel requested: %s; want cancelled", j.State)
	}
	for _, id := range []int64{others, takenBefore, successor} {
		if j := job(id); j.State != rivertype.JobStateRunning || len(j.Errors) != 0 {
			t.Fatalf("job %d, running in another process's attempt: %s with %d errors; want untouched", id, j.State, len(j.Errors))
		}
	}

	// Again, as a second process finding the same dead one would: nothing
	// more to do.
	res, err = taker.TakeOver(ctx, store.DepartedWorker{ClientID: "dead", Disconnected: true, LeaderElectedAt: elected, SeenAt: seen})
	if err != nil || res.Resigned || res.Retried+res.Discarded+res.Cancelled != 0 {
		t.Fatalf("second TakeOver = %+v, %v; want nothing done", res, err)
	}
	if c := taker.Counts(); c != (takeover.Counts{Processes: 2, Leaderships: 1, Retried: 1, Discarded: 1, Cancelled: 1}) {
		t.Fatalf("counts %+v", c)
	}
}

// TestLeadershipTopicIsRivers: River's own elector, resigning on a clean
// stop, notifies on the channel TakeOver's resignation uses, so followers
// wake for ours as they do for River's. If River renamed its topic, a
// resignation on the old one would wake nobody and a new leader would wait
// for the followers' next bid (5-6 s); this test fails first.
func TestLeadershipTopicIsRivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	listen, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(ctx)
	if _, err := listen.Exec(ctx, `LISTEN "`+testdb.RiverSchema+`.`+takeover.LeadershipTopic+`"`); err != nil {
		t.Fatal(err)
	}
	f, err := fleet.New(ctx, fleet.Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema, Logger: fleettest.Logger(t),
		Reconcilers: fleettest.Fast(workers.CancelReconcile)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the fleet elected leader", func() (bool, string) {
		return leader(t, db) == f.Client.ID(), "leader " + leader(t, db)
	})
	stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := f.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	waitCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	for {
		note, err := listen.WaitForNotification(waitCtx)
		if err != nil {
			t.Fatalf("River's resignation was not heard on %s.%s: %v", testdb.RiverSchema, takeover.LeadershipTopic, err)
		}
		if strings.Contains(note.Payload, `"resigned"`) && strings.Contains(note.Payload, f.Client.ID()) {
			return
		}
	}
}

// TestFleetTakesOverFromADeadLeader: a process of the fleet died holding
// River's leadership (for another hour, by its row) and a running job, and
// none of its connections is left. A process starting now becomes leader
// and runs that job at its first heartbeats, instead of waiting an hour for
// the leadership and RescueStuckJobsAfter plus River's rescuer for the job.
// The proof is causal, not a timing: the leadership row would otherwise
// last until its expiry, an hour after the test's bound.
func TestFleetTakesOverFromADeadLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at, conn_tag)
		VALUES ('dead', 'h', 1, now() - interval '1 minute', now() - interval '2 seconds', 'feedfacefeedface');
		INSERT INTO river.river_leader (leader_id, elected_at, expires_at)
		VALUES ('dead', now() - interval '3 seconds', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	job := runningJob(t, db, 1, []string{"dead"}, `{}`)

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelReconcile)})
	fleettest.WaitFor(t, 3*time.Minute, "the new process to lead", func() (bool, string) {
		return leader(t, db) == f.Client.ID(), "leader " + leader(t, db)
	})
	fleettest.WaitFor(t, 3*time.Minute, "the dead process's job to run again", func() (bool, string) {
		j, err := f.Client.JobGet(ctx, job)
		if err != nil {
			return false, err.Error()
		}
		return j.State == rivertype.JobStateCompleted && slices.Equal(j.AttemptedBy, []string{"dead", f.Client.ID()}),
			fleettest.Statusf("%s, attempted by %v", j.State, j.AttemptedBy)
	})
	if n := count(t, db, `SELECT count(*) FROM river.ffreconcile_worker WHERE client_id = 'dead'`); n != 0 {
		t.Fatalf("the dead process's heartbeat row is still there")
	}
	if c := f.Taker.Counts(); c.Processes != 1 || c.Leaderships != 1 || c.Retried != 1 {
		t.Fatalf("takeover counts %+v; want one process, its leadership and its job", c)
	}
	// Having ended the dead leader's term, the process started the ticks
	// itself (tagged leader-takeover) rather than leaving them to River's
	// new leader, whose periodic jobs start 0-6 s after its election.
	kind := workers.CancelReconcile.TickArgs().Kind()
	if n := count(t, db, `SELECT count(*) FROM river.river_job WHERE kind = '`+kind+`' AND '`+fleet.TagLeaderTakeover+`' = ANY(tags)`); n != 1 {
		t.Fatalf("%d %s ticks tagged %s; want 1, inserted at the takeover", n, kind, fleet.TagLeaderTakeover)
	}
}

// TestRestartTakesOverFromItsPreviousProcess: with a fixed client ID, a
// process restarted after a SIGKILL replaces its predecessor's heartbeat row
// before any other process has seen it disconnected, so it takes over from
// the predecessor itself, before it starts working: the leadership (which
// River would not give back to the same ID before its expiry) and the
// running job. A regression leaves the fleet without a leader until the
// predecessor's term expires (an hour here) and the job to River's rescuer.
func TestRestartTakesOverFromItsPreviousProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at, conn_tag)
		VALUES ('fixed-id', 'h', 1, now() - interval '1 minute', now() - interval '2 seconds', 'feedfacefeedface');
		INSERT INTO river.river_leader (leader_id, elected_at, expires_at)
		VALUES ('fixed-id', now() - interval '3 seconds', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	job := runningJob(t, db, 1, []string{"fixed-id"}, `{}`)
	f := fleettest.Start(t, db, fleet.Config{ClientID: "fixed-id", Reconcilers: fleettest.Fast(workers.CancelReconcile)})
	if c := f.Taker.Counts(); c.Processes != 1 || c.Leaderships != 1 || c.Retried != 1 {
		t.Fatalf("takeover counts once started: %+v; want the predecessor, its leadership and its job", c)
	}
	var elected time.Time
	fleettest.WaitFor(t, 3*time.Minute, "the restarted process to lead", func() (bool, string) {
		err := db.Pool.QueryRow(ctx, `SELECT elected_at FROM river.river_leader WHERE leader_id = 'fixed-id'`).Scan(&elected)
		return err == nil && time.Since(elected) < time.Minute, fleettest.Statusf("elected %v, %v", elected, err)
	})
	fleettest.WaitFor(t, 3*time.Minute, "the predecessor's job to run again", func() (bool, string) {
		j, err := f.Client.JobGet(ctx, job)
		if err != nil {
			return false, err.Error()
		}
		return j.State == rivertype.JobStateCompleted && len(j.AttemptedBy) == 2, fleettest.Statusf("%s, attempted by %v", j.State, j.AttemptedBy)
	})
}

// TestDisabledTakeoverLeavesTheDeadAlone: a process with DisableTakeover
// neither takes over nor deletes the dead process's row, which stays for a
// process that does (until it is stale).
func TestDisabledTakeoverLeavesTheDeadAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at, conn_tag)
		VALUES ('dead', 'h', 1, now() - interval '1 minute', now() - interval '2 seconds', 'feedfacefeedface')`); err != nil {
		t.Fatal(err)
	}
	job := runningJob(t, db, 1, []string{"dead"}, `{}`)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelReconcile), DisableTakeover: true})
	if f.Taker != nil {
		t.Fatal("a Taker with DisableTakeover")
	}
	// Two beats after the registration: the first beat's sweep, which
	// follows its upsert, is then over.
	beats, last := 0, time.Time{}
	fleettest.WaitFor(t, fleettest.Patient, "two heartbeats", func() (bool, string) {
		var at time.Time
		if err := db.Pool.QueryRow(ctx, `SELECT heartbeat_at FROM river.ffreconcile_worker WHERE client_id = $1`, f.Client.ID()).Scan(&at); err != nil {
			return false, err.Error()
		}
		if !at.Equal(last) {
			beats, last = beats+1, at
		}
		return beats > 2, fleettest.Statusf("%d rows seen", beats) // the registration's, then two beats
	})
	if n := count(t, db, `SELECT count(*) FROM river.ffreconcile_worker WHERE client_id = 'dead'`); n != 1 {
		t.Fatal("the dead process's row was deleted by a process that does not take over")
	}
	j, err := f.Client.JobGet(ctx, job)
	if err != nil || j.State != rivertype.JobStateRunning {
		t.Fatalf("the dead process's job: %v, %v; want still running (left to River's rescuer)", j.State, err)
	}
}

func leader(t *testing.T, db *testdb.DB) string {
	t.Helper()
	var id string
	err := db.Pool.QueryRow(context.Background(), `SELECT leader_id FROM river.river_leader`).Scan(&id)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return id
}

func count(t *testing.T, db *testdb.DB, sql string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
