package workers_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/workers"
)

// deadlineRow seeds and checks one row of a deadline reconciler.
type deadlineRow struct {
	r *workers.Reconciler
	// idArg is the row job's JSON arg holding the id insert returns.
	idArg string
	// scan is the reconciler's partition scan args.
	scan func(p int16) river.JobArgs
	// rowJob is the row job of the row insert returned, as a scan would
	// enqueue it for deadlineMs (nil: the reconciler's jobs carry none).
	rowJob func(p int16, id string, deadlineMs int64) river.JobArgs
	// work works one of rowJob's jobs with rivertest: workAs of its args
	// type (rivertest's worker is typed by the args).
	work func(t *testing.T, set *workers.Set, r *workers.Reconciler, pool *pgxpool.Pool, args river.JobArgs) river.EventKind
	// insert seeds a row of partition p falling due at deadlineMs.
	insert func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string
	// acted says whether the row's action has been applied.
	acted func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool
}

var deadlineRows = []deadlineRow{
	{
		r: workers.LeaseExpiry, idArg: "execution_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.LeaseReleaseArgs{Partition: p, ExecutionID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.LeaseReleaseArgs],
		scan: func(p int16) river.JobArgs { return jobs.LeaseExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(deadlineMs))
			return id
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.ReadAttempt(t, pool, p, id, 0).LeaseExpiresAtMs == nil
		},
	},
	{
		r: workers.SuspensionTimeout, idArg: "execution_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.SuspensionExpireArgs{Partition: p, ExecutionID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.SuspensionExpireArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.SuspensionTimeoutScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
				PublicState: "suspended", AttemptState: "attempt_interrupted"})
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(deadlineMs)})
			return id
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			_, ok := fftest.ReadSuspension(t, pool, p, id)
			return !ok
		},
	},
	{
		r: workers.DelayedPromotion, idArg: "execution_id",
		scan: func(p int16) river.JobArgs {
			return jobs.DelayedPromotionScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			return fftest.InsertExec(t, pool, fftest.Delayed(p, deadlineMs))
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.ReadExec(t, pool, p, id).EligibilityState == "eligible_now"
		},
	},
	{
		r: workers.AttemptTimeout, idArg: "execution_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.AttemptExpireArgs{Partition: p, ExecutionID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.AttemptExpireArgs],
		scan: func(p int16) river.JobArgs { return jobs.AttemptTimeoutScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(deadlineMs))
			return id
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			// No retries: the execution ends, its attempt expired.
			o := fftest.ReadAttempt(t, pool, p, id, 0).Outcome
			return o != nil && *o == "expired"
		},
	},
	{
		r: workers.ExecutionDeadline, idArg: "execution_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.DeadlineExpireArgs{Partition: p, ExecutionID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.DeadlineExpireArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.ExecutionDeadlineScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			return fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(deadlineMs)})
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.ReadExec(t, pool, p, id).LifecyclePhase == "terminal"
		},
	},
	{
		r: workers.WaitpointExpiry, idArg: "waitpoint_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.WaitpointCloseArgs{Partition: p, WaitpointID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.WaitpointCloseArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.WaitpointExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned"})
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id})
			return fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "approval", ExpiresAtMs: fftest.Ms(deadlineMs)})
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return !fftest.WaitpointExists(t, pool, p, id)
		},
	},
	{
		r: workers.BudgetReset, idArg: "budget_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.BudgetResetArgs{Partition: p, BudgetID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.BudgetResetArgs],
		scan: func(p int16) river.JobArgs { return jobs.BudgetResetScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			return fftest.InsertBudget(t, pool, fftest.Budget{Partition: p, NextResetAtMs: fftest.Ms(deadlineMs)})
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.ReadBudget(t, pool, p, id).NextResetAtMs == nil
		},
	},
	{
		r: workers.ClaimGrantExpiry, idArg: "grant_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.ClaimGrantExpireArgs{Partition: p, GrantID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.ClaimGrantExpireArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.ClaimGrantExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.PendingClaim(p))
			return fftest.InsertGrant(t, pool, fftest.Grant{Partition: p, ExecutionID: id, ExpiresAtMs: deadlineMs})
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.Count(t, pool, `SELECT count(*) FROM ff_claim_grant WHERE partition_key = $1 AND grant_id = decode($2, 'hex')`, p, id) == 0
		},
	},
	{
		r: workers.QuotaReconcile, idArg: "quota_policy_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.QuotaReconcileArgs{Partition: p, QuotaPolicyID: id, ExecutionID: "{fp:1}:" + id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.QuotaReconcileArgs],
		scan: func(p int16) river.JobArgs { return jobs.QuotaReconcileScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := "qp-" + fftest.NewUUID()
			fftest.InsertQuotaAdmitted(t, pool, p, id, "{fp:1}:"+id, deadlineMs)
			return id
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.Count(t, pool, `SELECT count(*) FROM ff_quota_admitted WHERE partition_key = $1 AND quota_policy_id = $2`, p, id) == 0
		},
	},
	{
		r: workers.BudgetDedupExpiry, idArg: "dedup_key",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.BudgetDedupDeleteArgs{Partition: p, DedupKey: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.BudgetDedupDeleteArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.BudgetDedupExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			key := "dedup-" + fftest.NewUUID()
			fftest.InsertBudgetDedup(t, pool, p, key, deadlineMs)
			return key
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return fftest.Count(t, pool, `SELECT count(*) FROM ff_budget_usage_dedup WHERE partition_key = $1 AND dedup_key = $2`, p, id) == 0
		},
	},
	{
		r: workers.WorkerRegistryTTL, idArg: "worker_instance_id",
		rowJob: func(p int16, id string, deadlineMs int64) river.JobArgs {
			return jobs.WorkerSweepArgs{Partition: p, Namespace: "default", WorkerInstanceID: id, DeadlineMs: deadlineMs}
		},
		work: workAs[jobs.WorkerSweepArgs],
		scan: func(p int16) river.JobArgs {
			return jobs.WorkerRegistryTTLScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}}
		},
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			return fftest.InsertWorker(t, pool, fftest.Worker{Partition: p, LastHeartbeatMs: deadlineMs - 30_000, TTLMs: 30_000})
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			return !fftest.WorkerExists(t, pool, p, "default", id)
		},
	},
	{
		// A header requested a grace before deadlineMs (the tests'
		// fleets keep the default grace), of a flow with one live member.
		r: workers.CancelBacklog, idArg: "flow_id",
		scan: func(p int16) river.JobArgs { return jobs.CancelBacklogScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			flow := fftest.NewUUID()
			fftest.InsertFlow(t, pool, p, flow, "cancelled", nil)
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow})
			fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow,
				RequestedAtMs: deadlineMs - workers.CancelBacklogGrace.Default.Milliseconds(), Members: []string{fftest.WireID(p, id)}})
			return flow
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			_, header := fftest.BacklogMembers(t, pool, p, id)
			return !header
		},
	},
	{
		// No lookahead: the lookahead tests (ahead_test.go) skip it. Its
		// rows are due once committed more than the stale threshold ago,
		// so insert dates an event's commit that long before deadlineMs
		// (the tests' fleets keep the default threshold).
		r: workers.Dependency, idArg: "event_id",
		scan: func(p int16) river.JobArgs { return jobs.DependencyScanArgs{ScanArgs: jobs.ScanArgs{Partition: p}} },
		insert: func(t *testing.T, pool *pgxpool.Pool, p int16, deadlineMs int64) string {
			id := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: fftest.NewUUID(), Outcome: "success",
				CommittedAtMs: deadlineMs - workers.DependencyStaleThreshold.Default.Milliseconds()})
			return strconv.FormatInt(id, 10)
		},
		acted: func(t *testing.T, pool *pgxpool.Pool, p int16, id string) bool {
			eventID, err := strconv.ParseInt(id, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return fftest.Dispatched(t, pool, p, eventID)
		},
	},
}

// TestDeadlineRowsCoverTheRegistry: every registered reconciler with row
// jobs scanned by deadline has its deadlineRow, so a new reconciler cannot
// skip the tick, busy-partition, follow-up and lookahead tests by being left
// out of the hand list. The cancel reconcilers (rows due as soon as they
// exist: TestBusyCancelPartitionIsSkipped) and retention (no row jobs:
// retention_test.go) have their own tests.
func TestDeadlineRowsCoverTheRegistry(t *testing.T) {
	t.Parallel()
	for _, r := range workers.All() {
		if !r.HasDue() || r.Due.Always || r.RowKind() == "" {
			continue
		}
		if !slices.ContainsFunc(deadlineRows, func(d deadlineRow) bool { return d.r == r }) {
			t.Errorf("reconciler %s has no deadlineRow", r.Name)
		}
	}
}

// startLookingAhead starts a fleet ticking reconciler every second with the
// given lookahead margin (its window: 1 s plus that), and waits for its first
// tick.
func startLookingAhead(t *testing.T, db *testdb.DB, r *workers.Reconciler, margin time.Duration) (*fleet.Fleet, *workers.Counters) {
	t.Helper()
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(r), Lookahead: margin})
	c := f.Workers.Stats().For(r.Name)
	fleettest.WaitFor(t, fleettest.Patient, "the first tick", func() (bool, string) {
		return c.Ticks.Load() > 0, "no tick yet"
	})
	return f, c
}

// startBusy is startLookingAhead with the rows queue paused: row jobs stay
// available, so their partitions stay busy.
func startBusy(t *testing.T, db *testdb.DB, r *workers.Reconciler, margin time.Duration) (*fleet.Fleet, *workers.Counters) {
	t.Helper()
	f, c := startLookingAhead(t, db, r, margin)
	if err := f.Client.QueuePause(context.Background(), jobs.QueueRows, nil); err != nil {
		t.Fatal(err)
	}
	return f, c
}

// noSweep enables no reconciler tick (in particular not delayed_promotion),
// so only ad-hoc promotions can promote anything.
func noSweep() map[string]time.Duration { return map[string]time.Duration{} }

// insertOnlyClient is what another service runs: a River client with no
// workers or queues, on its own pool, inserting jobs.PromoteArgs.
func insertOnlyClient(t *testing.T, pool *pgxpool.Pool) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: testdb.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// riverJob is what tests read back from river_job.
type riverJob struct {
	State   string
	Attempt int
	Errors  []string
	Snoozes int64
}

func readJob(t *testing.T, pool *pgxpool.Pool, id int64) riverJob {
	t.Helper()
	var (
		j    riverJob
		errs []string
	)
	err := pool.QueryRow(context.Background(), `
		SELECT state::text, attempt, coalesce((SELECT array_agg(e->>'error') FROM unnest(errors) e), '{}'),
		       coalesce((metadata->>'snoozes')::bigint, 0)
		  FROM river.river_job WHERE id = $1`, id).Scan(&j.State, &j.Attempt, &errs, &j.Snoozes)
	if err != nil {
		t.Fatalf("read river_job %d: %v", id, err)
	}
	j.Errors = errs
	return j
}

func waitPromoted(t *testing.T, pool *pgxpool.Pool, p int16, id string, timeout time.Duration) {
	t.Helper()
	fleettest.WaitFor(t, timeout, "execution "+id+" promoted", func() (bool, string) {
		ex := fftest.ReadExec(t, pool, p, id)
		return ex.EligibilityState == "eligible_now", fleettest.Statusf("eligibility %s", ex.EligibilityState)
	})
}

func waitJobState(t *testing.T, pool *pgxpool.Pool, id int64, state string) riverJob {
	t.Helper()
	var j riverJob
	fleettest.WaitFor(t, fleettest.Patient, "job reaching state "+state, func() (bool, string) {
		j = readJob(t, pool, id)
		return j.State == state, fleettest.Statusf("%+v", j)
	})
	return j
}

// somePartitions returns n partitions spread over 0..255. Tests seed only
// these and count with partition_key = ANY(…), which prunes to their
// children at plan time: a count over all 256 children and their indexes
// takes over a thousand lock-table slots, and parallel tests sharing a
// server with the default max_locks_per_transaction (64) then fail with
// "out of shared memory".
func somePartitions(n int) []int16 {
	out := make([]int16, n)
	for i := range out {
		out[i] = int16(i * 256 / n)
	}
	return out
}

// waitTicks waits until the fleet has run n more ticks of a reconciler, so a
// test can check that something was left alone.
func waitTicks(t *testing.T, f *fleet.Fleet, r *workers.Reconciler, n int64) {
	t.Helper()
	waitTicksOfAll(t, f, []*workers.Reconciler{r}, n)
}

// waitTicksOfAll waits until the fleet has run n more ticks of each of rs,
// counted from the call for all of them at once: their ticks run side by
// side, so waiting for one after another cost n intervals each (22 s of
// TestFilteredFleetLeavesOtherTenantsAlone's 50).
func waitTicksOfAll(t *testing.T, f *fleet.Fleet, rs []*workers.Reconciler, n int64) {
	t.Helper()
	start := make([]int64, len(rs))
	for i, r := range rs {
		start[i] = f.Workers.Stats().For(r.Name).Ticks.Load()
	}
	fleettest.WaitFor(t, fleettest.Patient, "more ticks", func() (bool, string) {
		for i, r := range rs {
			if got := f.Workers.Stats().For(r.Name).Ticks.Load(); got < start[i]+n {
				return false, fleettest.Statusf("%s: %d ticks (from %d)", r.Name, got, start[i])
			}
		}
		return true, ""
	})
}

// captureLogger returns a logger recording warnings and errors, and a
// function returning what it recorded. The record is logged when the test
// fails.
func captureLogger(t *testing.T) (*slog.Logger, func() string) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	read := func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleet logs:\n%s", read())
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})), read
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// duplicateRowJobs inserts copies row jobs of kind for each args, with plain
// SQL and so without a unique key, as a client without River's uniqueness
// (or a rescued job running again) would leave them: two processes then
// run the same row's action at the same time, which only its re-check under
// the row lock keeps to one effect.
func duplicateRowJobs(t *testing.T, db *testdb.DB, kind string, args []string, copies int) {
	t.Helper()
	for _, a := range args {
		for range copies {
			db.InsertRawJob(t, kind, jobs.QueueRows, "available", a)
		}
	}
}

// requireBothRaced checks that both processes ran row jobs of r, and that
// the duplicates of rows rows (see duplicateRowJobs) ended as no-ops: the
// race a two-process test claims to exercise happened.
func requireBothRaced(t *testing.T, r *workers.Reconciler, f1, f2 *fleet.Fleet, rows int) {
	t.Helper()
	s1, s2 := f1.Workers.Stats().For(r.Name).Snapshot(), f2.Workers.Stats().For(r.Name).Snapshot()
	t.Logf("row jobs: process 1 applied %d, no-op %d; process 2 applied %d, no-op %d", s1.Applied, s1.NoOps, s2.Applied, s2.NoOps)
	if s1.Applied+s1.NoOps == 0 || s2.Applied+s2.NoOps == 0 {
		t.Fatalf("one process ran no row job of %s: the race was not exercised", r.Name)
	}
	if s1.NoOps+s2.NoOps < int64(rows) {
		t.Fatalf("%d no-ops for %d rows with duplicate jobs; want at least one each", s1.NoOps+s2.NoOps, rows)
	}
}

// waitApplied waits until c counts at least n applied row actions: a row
// job's statement commits before its worker counts it, so a test that saw
// the row change checks the counters only once they have caught up.
func waitApplied(t *testing.T, c *workers.Counters, n int64) {
	t.Helper()
	fleettest.WaitFor(t, fleettest.Patient, "the row actions counted", func() (bool, string) {
		return c.Applied.Load() >= n, fleettest.Statusf("%+v", c.Snapshot())
	})
}
