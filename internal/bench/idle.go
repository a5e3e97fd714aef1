package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// IdleResult compares what an idle fleet costs Postgres with the seed's
// loops, which scan every partition every tick: once for the seed's own
// reconcilers and once for every reconciler against FlowFabric's whole
// scanner supervisor (see idleSets).
type IdleResult struct {
	Window     time.Duration
	NotDueRows int
	Runs       []IdleRun
}

// IdleRun is one idle comparison: a fleet of some reconcilers against the
// seed's loops they replace.
type IdleRun struct {
	Set        string // which reconcilers (idleSet.name)
	Ours, Seed IdleCost
}

// IdleCost is what one side costs Postgres while nothing is due.
type IdleCost struct {
	StatementsPerSec float64
	BackendCPUPct    float64 // % of one core used by its Postgres backends
	XactPerSec       float64 // pg_stat_database.xact_commit, whole database
}

// idleSet is a set of our reconcilers and the seed's loops they replace.
type idleSet struct {
	name        string
	reconcilers []*workers.Reconciler // nil: the fleet's defaults
	loops       []string              // seedIdleLoops by name; nil: all
}

// idleSets: the seed's five reconcilers against their loops (delayed
// promotion has none on Postgres), then the default fleet against
// FlowFabric's whole scanner supervisor.
func idleSets() []idleSet {
	return []idleSet{
		{name: "the seed's reconcilers",
			reconcilers: []*workers.Reconciler{workers.LeaseExpiry, workers.SuspensionTimeout, workers.DelayedPromotion,
				workers.CancelDispatch, workers.CancelReconcile},
			loops: []string{"lease_expiry", "suspension_timeout", "cancel_dispatch", "cancel_reconcile"}},
		{name: "every reconciler"},
	}
}

func (e *env) idle(ctx context.Context) (IdleResult, error) {
	res := IdleResult{Window: e.cfg.IdleFor, NotDueRows: e.cfg.ScaleSmall}
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	// Not-due rows in every table the reconcilers scan.
	start := time.Now()
	if err := leaseScenario.seed(ctx, e, 0, e.cfg.ScaleSmall); err != nil {
		return res, err
	}
	if err := seedIdleTimers(ctx, e, e.cfg.ScaleSmall); err != nil {
		return res, err
	}
	e.seeded("idle", start)
	if err := e.settle(ctx, false); err != nil {
		return res, err
	}
	for _, set := range idleSets() {
		run, err := e.idleRun(ctx, set)
		if err != nil {
			return res, fmt.Errorf("%s: %w", set.name, err)
		}
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// idleRun measures set's fleet, then its seed loops, on the same data.
func (e *env) idleRun(ctx context.Context, set idleSet) (IdleRun, error) {
	run := IdleRun{Set: set.name}
	e.progress("idle, %s: ours for %s", set.name, e.cfg.IdleFor)
	fc := e.fleetConfig()
	if set.reconcilers != nil {
		fc.Reconcilers = map[string]time.Duration{}
		for _, r := range set.reconcilers {
			fc.Reconcilers[r.Name] = r.Interval
		}
	}
	var err error
	if run.Ours, err = e.idleOurs(ctx, fc); err != nil {
		return run, err
	}

	// The seed: each reconciler's loop walks all partitions every interval.
	e.progress("idle, %s: seed loops for %s", set.name, e.cfg.IdleFor)
	seedTr := &countingTracer{}
	pool, err := dbconn.Open(ctx, e.url, dbconn.Options{MaxConns: 8, AppName: "ffreconcile-seedloop", Tracer: seedTr})
	if err != nil {
		return run, err
	}
	defer pool.Close()
	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, l := range seedIdleLoops() {
		if set.loops != nil && !slices.Contains(set.loops, l.name) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(l.interval)
			defer t.Stop()
			for {
				if err := l.tick(loopCtx, pool); err != nil && loopCtx.Err() == nil {
					e.log.Warn("seed idle loop", "loop", l.name, "error", err)
				}
				select {
				case <-loopCtx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	run.Seed, err = e.measure(ctx, []string{"ffreconcile-seedloop"}, func() int64 { return seedTr.n.Load() })
	stopLoops()
	wg.Wait()
	if err != nil {
		return run, err
	}
	e.progress("idle, %s: ours %.1f stmt/s, %.2f%% CPU; seed %.1f stmt/s, %.2f%% CPU", set.name,
		run.Ours.StatementsPerSec, run.Ours.BackendCPUPct, run.Seed.StatementsPerSec, run.Seed.BackendCPUPct)
	return run, nil
}

// idleOurs starts a fleet of fc and measures what it costs over the idle
// window, once elected and ticking.
func (e *env) idleOurs(ctx context.Context, fc fleet.Config) (IdleCost, error) {
	tr := &countingTracer{}
	f, err := fleet.New(ctx, withTracer(fc, tr))
	if err != nil {
		return IdleCost{}, err
	}
	if err := f.Start(ctx); err != nil {
		f.Close()
		return IdleCost{}, err
	}
	time.Sleep(3 * time.Second) // leader election, first ticks, pools warm
	var apps []string
	for _, pool := range []string{"ffreconcile-river", "ffreconcile-work", "ffreconcile-tick"} {
		apps = append(apps, store.ConnTagged(pool, f.ConnTag))
	}
	cost, err := e.measure(ctx, apps, func() int64 { return tr.n.Load() })
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_ = f.Stop(stopCtx)
	cancel()
	f.Close()
	return cost, err
}

// measure samples, over the idle window, the statements counted client-side,
// the CPU time of the Postgres backends serving the given application names
// (from /proc, the server runs on this machine), and committed transactions.
func (e *env) measure(ctx context.Context, apps []string, count func() int64) (IdleCost, error) {
	cpu0, err := e.backendCPU(ctx, apps)
	if err != nil {
		return IdleCost{}, err
	}
	x0, err := e.xacts(ctx)
	if err != nil {
		return IdleCost{}, err
	}
	n0, t0 := count(), time.Now()
	time.Sleep(e.cfg.IdleFor)
	n1, secs := count(), time.Since(t0).Seconds()
	cpu1, err := e.backendCPU(ctx, apps)
	if err != nil {
		return IdleCost{}, err
	}
	x1, err := e.xacts(ctx)
	if err != nil {
		return IdleCost{}, err
	}
	var cpuSecs float64
	for pid, c := range cpu1 {
		cpuSecs += c - cpu0[pid] // a backend that appeared mid-window counts from 0
	}
	// The two sampling queries themselves commit 2 transactions.
	return IdleCost{StatementsPerSec: float64(n1-n0) / secs, BackendCPUPct: 100 * cpuSecs / secs, XactPerSec: float64(x1-x0-2) / secs}, nil
}

func (e *env) xacts(ctx context.Context) (int64, error) {
	var n int64
	err := e.pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// backendCPU returns user+system CPU seconds per backend pid.
func (e *env) backendCPU(ctx context.Context, apps []string) (map[int]float64, error) {
	rows, err := e.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = ANY($1)`, apps)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	out := map[int]float64{}
	for _, pid := range pids {
		// A miss: the server is not on this machine, or the backend exited.
		if cpu, _, ok := procCPU(int(pid)); ok {
			out[int(pid)] = cpu.Seconds()
		}
	}
	return out, nil
}

// seedIdleTimers adds not-due rows to the tables of the timers beyond the
// lease: n waitpoints expiring in an hour (of suspended executions), a
// thousand budgets resetting in an hour, and 512 live worker registrations.
func seedIdleTimers(ctx context.Context, e *env, n int) error {
	hence := time.Now().UnixMilli() + 3_600_000
	execs := make([]ffseed.Exec, n)
	waitpoints := make([]ffseed.Waitpoint, n)
	for i := range n {
		p := int16((i + 1) % 256)
		execs[i] = ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), LaneID: "bench", LifecyclePhase: "suspended",
			OwnershipState: "unowned", PublicState: "suspended", AttemptState: "attempt_interrupted"}
		waitpoints[i] = ffseed.Waitpoint{Partition: p, ExecutionID: execs[i].ID, TokenKid: "kid", ExpiresAtMs: &hence}
	}
	if err := errors.Join(ffseed.InsertMany(ctx, e.pool, execs), ffseed.InsertMany(ctx, e.pool, waitpoints)); err != nil {
		return fmt.Errorf("seed idle waitpoints: %w", err)
	}
	if err := ffseed.InsertSeries(ctx, e.pool, 1000, func(i int) ffseed.Budget {
		return ffseed.Budget{Partition: int16((i + 1) % 32), ID: "bench-" + strconv.Itoa(i+1),
			Policy: json.RawMessage(`{"reset_interval_ms": 3600000}`), NextResetAtMs: &hence}
	}); err != nil {
		return fmt.Errorf("seed idle budgets: %w", err)
	}
	now := time.Now().UnixMilli()
	if err := ffseed.InsertSeries(ctx, e.pool, 512, func(i int) ffseed.WorkerRegistration {
		return ffseed.WorkerRegistration{Partition: int16((i + 1) % 256), Namespace: "bench", InstanceID: "bench-" + strconv.Itoa(i+1),
			WorkerID: "bench", LastHeartbeatMs: now, TTLMs: 3_600_000}
	}); err != nil {
		return fmt.Errorf("seed idle workers: %w", err)
	}
	// The background duties' rows, none due for an hour: claim grants of
	// executions pending their claim, quota admissions, budget dedup keys,
	// and cancel backlogs (requested an hour ahead: a header is due its
	// grace, 30 s, after its request, and the idle windows last longer).
	hour := time.Now().UnixMilli() + 3_600_000
	const duties = 1000
	pending := make([]string, duties)
	for i := range pending {
		pending[i] = ffseed.NewUUID()
	}
	for what, insert := range map[string]func() error{
		"claim grants": func() error {
			return errors.Join(
				ffseed.InsertSeries(ctx, e.pool, duties, func(i int) ffseed.Exec {
					return ffseed.Exec{Partition: int16((i + 1) % 256), ID: pending[i], LaneID: "bench", LifecyclePhase: "runnable",
						OwnershipState: "unowned", EligibilityState: "pending_claim", PublicState: "waiting",
						AttemptState: "pending_first_attempt", CreatedAtMs: 1}
				}),
				ffseed.InsertSeries(ctx, e.pool, duties, func(i int) ffseed.ClaimGrant {
					return ffseed.ClaimGrant{Partition: int16((i + 1) % 256), ExecutionID: pending[i], WorkerID: "bench",
						WorkerInstanceID: "bench-1", GrantTTLMs: 3_600_000, IssuedAtMs: 1, ExpiresAtMs: hour}
				}))
		},
		"quota admissions": func() error {
			return ffseed.InsertSeries(ctx, e.pool, duties, func(i int) ffseed.QuotaAdmitted {
				g := i + 1
				return ffseed.QuotaAdmitted{Partition: int16(g % 32), PolicyID: "bench-quota-" + strconv.Itoa(g%100),
					ExecutionID: "{fp:" + strconv.Itoa(g%256) + "}:" + ffseed.NewUUID(), AdmittedAtMs: 1, ExpiresAtMs: hour}
			})
		},
		"budget dedup keys": func() error {
			return ffseed.InsertSeries(ctx, e.pool, duties, func(i int) ffseed.BudgetDedup {
				return ffseed.BudgetDedup{Partition: int16((i + 1) % 32), Key: "bench-usage-" + strconv.Itoa(i+1),
					Outcome: json.RawMessage(`{}`), AppliedAtMs: 1, ExpiresAtMs: hour}
			})
		},
		"cancel backlogs": func() error {
			return ffseed.InsertSeries(ctx, e.pool, duties, func(i int) ffseed.CancelBacklog {
				return ffseed.CancelBacklog{Partition: int16((i + 1) % 256), FlowID: ffseed.NewUUID(), RequestedAtMs: hour,
					Reason: "bench", Policy: "cancel_flow_only"}
			})
		},
	} {
		if err := insert(); err != nil {
			return fmt.Errorf("seed idle %s: %w", what, err)
		}
	}
	return nil
}

// clockTicks is USER_HZ, 100 on Linux.
const clockTicks = 100

// seedIdleLoop is one of FlowFabric's Postgres reconciler loops at idle.
type seedIdleLoop struct {
	name     string
	interval time.Duration
	tick     func(ctx context.Context, db *pgxpool.Pool) error
}

func seedIdleLoops() []seedIdleLoop {
	perPartition := func(sql string) func(context.Context, *pgxpool.Pool) error {
		return func(ctx context.Context, db *pgxpool.Pool) error {
			now := time.Now().UnixMilli()
			for p := range int16(jobs.PartitionCount) {
				rows, err := db.Query(ctx, sql, p, now, seedBatch)
				if err != nil {
					return err
				}
				rows.Close()
			}
			return nil
		}
	}
	// FlowFabric's whole Postgres scanner supervisor (scanner_supervisor.rs):
	// its eight loops at their default intervals. execution_deadline and
	// pending_wp_expiry are not among them (FlowFabric runs them on Valkey
	// only), nor is a delayed-promotion sweep.
	return []seedIdleLoop{
		{"attempt_timeout", workers.AttemptTimeout.Interval, perPartition(`
			SELECT a.execution_id, a.attempt_index FROM ff_attempt a
			  JOIN ff_exec_core c ON c.partition_key = a.partition_key AND c.execution_id = a.execution_id
			 WHERE a.partition_key = $1 AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2
			   AND c.lifecycle_phase = 'active'
			 ORDER BY a.lease_expires_at_ms ASC LIMIT $3`)},
		// budget_reset walks the 32 budget partitions, 20 rows a batch.
		{"budget_reset", workers.BudgetReset.Interval, func(ctx context.Context, db *pgxpool.Pool) error {
			now := time.Now().UnixMilli()
			for p := range int16(workers.DefaultBudgetPartitionCount) {
				rows, err := db.Query(ctx, `SELECT budget_id FROM ff_budget_policy
					 WHERE partition_key = $1 AND next_reset_at_ms IS NOT NULL AND next_reset_at_ms <= $2
					 ORDER BY next_reset_at_ms ASC LIMIT 20`, p, now)
				if err != nil {
					return err
				}
				rows.Close()
			}
			return nil
		}},
		// The registry TTL sweep: one DELETE per registry partition.
		{"worker_registry_ttl", workers.WorkerRegistryTTL.Interval, func(ctx context.Context, db *pgxpool.Pool) error {
			now := time.Now().UnixMilli()
			for p := range int16(workers.RegistryPartitionCount) {
				if _, err := db.Exec(ctx, `WITH swept AS (
					    DELETE FROM ff_worker_registry WHERE partition_key = $1 AND last_heartbeat_ms + liveness_ttl_ms < $2
					    RETURNING partition_key, namespace, worker_instance_id
					), ev AS (
					    INSERT INTO ff_worker_registry_event (partition_key, namespace, worker_instance_id, event_kind, event_at_ms, reason)
					    SELECT partition_key, namespace, worker_instance_id, 'ttl_swept', $2, NULL FROM swept
					    ON CONFLICT DO NOTHING RETURNING 1
					) SELECT count(*) FROM swept`, p, now); err != nil {
					return err
				}
			}
			return nil
		}},
		// The dependency reconciler (not part of this fleet): one global
		// query for stale undispatched completion events, every 15 s.
		{"dependency", 15 * time.Second, func(ctx context.Context, db *pgxpool.Pool) error {
			rows, err := db.Query(ctx, `SELECT event_id, namespace, instance_tag FROM ff_completion_event
				 WHERE dispatched_at_ms IS NULL AND committed_at_ms < $1
				   AND ($2::text IS NULL OR namespace = $2) AND ($3::text IS NULL OR instance_tag = $3)
				 ORDER BY event_id ASC LIMIT 1000`, time.Now().UnixMilli()-1000, nil, nil)
			if err == nil {
				rows.Close()
			}
			return err
		}},
		{"lease_expiry", workers.LeaseExpiry.Interval, perPartition(`
			SELECT execution_id, attempt_index FROM ff_attempt
			 WHERE partition_key = $1 AND lease_expires_at_ms IS NOT NULL AND lease_expires_at_ms < $2
			 ORDER BY lease_expires_at_ms ASC LIMIT $3`)},
		{"suspension_timeout", workers.SuspensionTimeout.Interval, perPartition(`
			SELECT execution_id, timeout_behavior FROM ff_suspension_current
			 WHERE partition_key = $1 AND timeout_at_ms IS NOT NULL AND timeout_at_ms < $2
			 ORDER BY timeout_at_ms ASC LIMIT $3`)},
		// The dispatcher reads 50 groups across all partitions per tick; its
		// reconciler does the same every 10 s. FlowFabric does not sweep
		// delayed promotions on Postgres at all.
		{"cancel_dispatch", workers.CancelDispatch.Interval, func(ctx context.Context, db *pgxpool.Pool) error {
			rows, err := db.Query(ctx, `SELECT partition_key, flow_id, downstream_eid FROM ff_pending_cancel_groups ORDER BY enqueued_at_ms LIMIT 50`)
			if err == nil {
				rows.Close()
			}
			return err
		}},
		{"cancel_reconcile", workers.CancelReconcile.Interval, func(ctx context.Context, db *pgxpool.Pool) error {
			rows, err := db.Query(ctx, `SELECT partition_key, flow_id, downstream_eid FROM ff_pending_cancel_groups ORDER BY enqueued_at_ms LIMIT 50`)
			if err == nil {
				rows.Close()
			}
			return err
		}},
	}
}
