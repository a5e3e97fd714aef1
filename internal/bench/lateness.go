package bench

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// latenessRun feeds a steady stream of rows becoming due and measures, per
// row, the time from its deadline to the commit of the action on it.
type latenessRun struct {
	name       string
	reconciler string // whose tick interval the targets refer to
	// feed inserts n rows due at deadlineMs.
	feed func(ctx context.Context, e *env, n int, deadlineMs int64) error
	// remaining counts rows fed but not yet acted on.
	remaining func(ctx context.Context, db store.DB) (int, error)
	// latencies returns, for every acted-on row, action time − deadline in ms.
	latencies func(ctx context.Context, db store.DB) ([]float64, error)
	// configure adjusts the fleet (e.g. disable a sweep).
	configure func(*fleet.Config)
	// oneLead: run with the first of Config.LatenessLeads only (an ad-hoc
	// promotion is scheduled for its at, whenever it was inserted).
	oneLead bool
	// prepare, when set, replaces the fresh database every run starts
	// from (e.g. with a copy holding a backlog).
	prepare func(ctx context.Context, e *env) error
	// afterStream, when set, runs once the stream has ended, before the
	// rows are drained.
	afterStream func(ctx context.Context, e *env) error
}

// LatenessResult is the distribution of action − deadline.
type LatenessResult struct {
	Name     string
	Interval time.Duration
	// Lead is how long before its deadline each row was inserted.
	Lead          time.Duration
	Rate, Rows    int
	P50, P99, Max time.Duration
	// Stages splits the pipeline by River's own timestamps of the run's jobs.
	Stages []Stage
	// Stats is what our process did (statsLine).
	Stats string
	// CPU is the machine's CPU per row from the stream's start until the
	// last row was acted on (the feeder's inserts included).
	CPU CPUCost
}

// Stage is one step between a row's deadline and its action: p50 and p99
// over the run's jobs of one kind.
type Stage struct {
	Kind, Step string
	Jobs       int
	P50, P99   time.Duration
}

// stagesSQL measures, per job kind of one reconciler, the wait in the queue
// (scheduled_at → attempted_at), the run (attempted_at → finalized_at),
// for row jobs of the stream's rows the time from the row's deadline to
// their insertion (tick wait + fan-out + scan; negative ahead), and per tick
// the time its burst of scans took to start. A row's deadline is the one
// the stream gave its execution (raw_fields.bench_deadline_ms, found by the
// job's partition and execution_id; row jobs of rows already due carry
// none), else the job's deadline_ms, else, for a job given a schedule of
// its own, that schedule less 1 ms, as the workers read it. Index: the
// executions' primary key.
const stagesSQL = `
WITH j AS (
    SELECT r.kind, r.scheduled_at, r.created_at, r.attempted_at, r.finalized_at,
           coalesce((e.raw_fields->>'bench_deadline_ms')::bigint, (r.args->>'deadline_ms')::bigint,
                    CASE WHEN r.queue = 'ff_rows' AND r.scheduled_at <> r.created_at AND r.errors IS NULL
                         THEN (extract(epoch FROM r.scheduled_at) * 1000)::bigint - 1 END) AS deadline_ms
      FROM river.river_job r
      LEFT JOIN ff_exec_core e
        ON r.queue = 'ff_rows' AND r.args ? 'partition' AND r.args ? 'execution_id'
       AND e.partition_key = (r.args->>'partition')::smallint AND e.execution_id = (r.args->>'execution_id')::uuid
     WHERE r.kind LIKE 'ff.' || $1 || '.%' AND r.state = 'completed' AND r.attempted_at IS NOT NULL
), s AS (
    SELECT kind, 'queue wait' AS step, extract(epoch FROM attempted_at - scheduled_at) * 1000 AS ms FROM j
    UNION ALL
    SELECT kind, 'run', extract(epoch FROM finalized_at - attempted_at) * 1000 FROM j
    UNION ALL
    SELECT kind, 'deadline → enqueued', extract(epoch FROM created_at) * 1000 - deadline_ms FROM j WHERE deadline_ms IS NOT NULL
    UNION ALL
    -- One tick's scans share the created_at of its fan-out insert.
    SELECT kind, 'fan-out → last scan started', extract(epoch FROM max(attempted_at) - created_at) * 1000
      FROM j WHERE kind LIKE '%.scan' GROUP BY kind, created_at HAVING count(*) > 1
)
SELECT kind, step, count(*)::int,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8
  FROM s GROUP BY kind, step ORDER BY kind, step`

func (e *env) stages(ctx context.Context, reconciler string) ([]Stage, error) {
	return e.stagesOf(ctx, stagesSQL, reconciler)
}

// stagesOf reads Stages from a statement returning kind, step, jobs, p50
// and p99 in milliseconds.
func (e *env) stagesOf(ctx context.Context, sql string, args ...any) ([]Stage, error) {
	rows, err := e.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("stages: %w", err)
	}
	var out []Stage
	for rows.Next() {
		var st Stage
		var p50, p99 float64
		if err := rows.Scan(&st.Kind, &st.Step, &st.Jobs, &p50, &p99); err != nil {
			return nil, fmt.Errorf("stages: %w", err)
		}
		st.P50, st.P99 = time.Duration(p50*float64(time.Millisecond)), time.Duration(p99*float64(time.Millisecond))
		out = append(out, st)
	}
	return out, rows.Err()
}

const feedEvery = 100 * time.Millisecond

// lateness runs one stream, each row inserted lead before its deadline.
func (e *env) lateness(ctx context.Context, lr latenessRun, lead time.Duration) (LatenessResult, error) {
	res := LatenessResult{Name: lr.name, Interval: intervalOf(lr.reconciler), Lead: lead, Rate: e.cfg.LatenessRate}
	prepare := func(ctx context.Context, e *env) error { return e.reset(ctx) }
	if lr.prepare != nil {
		prepare = lr.prepare
	}
	if err := prepare(ctx, e); err != nil {
		return res, err
	}
	cfg := e.fleetConfig()
	if lr.configure != nil {
		lr.configure(&cfg)
	}
	f, err := fleet.New(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer f.Close()
	if err := e.warmFleet(ctx, f, lr.reconciler); err != nil {
		return res, err
	}
	if err := f.Start(ctx); err != nil {
		return res, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
	}()

	// The stream starts once the fleet is up: a leader elected and the
	// reconciler's first tick run (its first plan alone takes ~0.5 s).
	// Rows due before that would measure start-up, not steady state.
	if _, sweeps := f.Config.Reconcilers[lr.reconciler]; sweeps {
		started := time.Now()
		ticks := &f.Workers.Stats().For(lr.reconciler).Ticks
		for ticks.Load() == 0 {
			if time.Since(started) > time.Minute {
				return res, fmt.Errorf("no %s tick within a minute of starting the fleet", lr.reconciler)
			}
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		e.progress("lateness %s: first tick %s after start", lr.name, time.Since(started).Round(time.Millisecond))
	}
	stopProfile, err := e.startCPUProfile("lateness-" + lr.reconciler)
	if err != nil {
		return res, err
	}
	defer stopProfile()
	e.progress("lateness %s: %d rows/s for %s, each inserted %s before its deadline", lr.name, e.cfg.LatenessRate, e.cfg.LatenessFor, lead)
	perFeed := max(1, e.cfg.LatenessRate*int(feedEvery/time.Millisecond)/1000)
	cpu := sampleCPU()
	tick := time.NewTicker(feedEvery)
	defer tick.Stop()
	stop := time.Now().Add(e.cfg.LatenessFor)
	for time.Now().Before(stop) {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
		deadline := time.Now().Add(lead).UnixMilli()
		if err := lr.feed(ctx, e, perFeed, deadline); err != nil {
			return res, fmt.Errorf("feed: %w", err)
		}
		res.Rows += perFeed
	}
	if lr.afterStream != nil {
		if err := lr.afterStream(ctx, e); err != nil {
			return res, err
		}
	}
	if _, err := waitDrained(ctx, 2*time.Minute, func(ctx context.Context) (int, error) { return lr.remaining(ctx, e.pool) }); err != nil {
		return res, err
	}
	res.CPU = cpu.per(res.Rows)
	lat, err := lr.latencies(ctx, e.pool)
	if err != nil {
		return res, err
	}
	if len(lat) != res.Rows {
		return res, fmt.Errorf("measured %d rows of %d fed", len(lat), res.Rows)
	}
	res.Stats = statsLine(f.Workers.Stats().For(lr.reconciler).Snapshot(), f.Waker)
	e.progress("lateness %s: CPU per row %s; %s", lr.name, res.CPU, res.Stats)
	sort.Float64s(lat)
	ms := func(q float64) time.Duration {
		return time.Duration(lat[min(len(lat)-1, int(q*float64(len(lat))))] * float64(time.Millisecond))
	}
	res.P50, res.P99, res.Max = ms(0.50), ms(0.99), time.Duration(lat[len(lat)-1]*float64(time.Millisecond))
	e.progress("lateness %s: p50 %s, p99 %s, max %s over %d rows", lr.name, res.P50, res.P99, res.Max, res.Rows)
	if res.Stages, err = e.stages(ctx, lr.reconciler); err != nil {
		return res, err
	}
	for _, st := range res.Stages {
		e.progress("  %s %s: p50 %s, p99 %s (%d jobs)", st.Kind, st.Step, st.P50.Round(time.Millisecond), st.P99.Round(time.Millisecond), st.Jobs)
	}
	return res, nil
}

func collectFloats(rows pgx.Rows, err error) ([]float64, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[float64])
}

var leaseLateness = latenessRun{
	name:       "lease expiry",
	reconciler: "lease_expiry",
	configure:  withoutAttemptTimeout,
	feed: func(ctx context.Context, e *env, n int, deadlineMs int64) error {
		raw := rawJSON(map[string]any{"bench_deadline_ms": deadlineMs})
		keys := randomKeys(n)
		return errors.Join(
			ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Exec {
				return ffseed.Exec{Partition: keys[i].Partition, ID: keys[i].ExecutionID, LaneID: "bench", CreatedAtMs: 1, RawFields: raw}
			}),
			ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Attempt {
				return ffseed.Attempt{Partition: keys[i].Partition, ExecutionID: keys[i].ExecutionID, LeaseEpoch: 1,
					LeaseExpiresAtMs: ffseed.Ms(deadlineMs)}
			}))
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`).Scan(&n)
		return n, err
	},
	// The event's occurred_at_ms is the action's clock, taken in the same
	// statement that commits it.
	latencies: func(ctx context.Context, db store.DB) ([]float64, error) {
		// Only the stream's rows: a run may start from a database holding
		// other executions and events (the retention section's backlog).
		return collectFloats(db.Query(ctx, `
			SELECT (ev.occurred_at_ms - (e.raw_fields->>'bench_deadline_ms')::bigint)::float8
			  FROM ff_lease_event ev
			  JOIN ff_exec_core e ON e.partition_key = ev.partition_key AND e.execution_id = ev.execution_id::uuid
			 WHERE ev.event_type = 'expired' AND e.raw_fields ? 'bench_deadline_ms'`))
	},
}

// intervalOf is the default tick interval of the reconciler named name.
func intervalOf(name string) time.Duration {
	if r, ok := workers.ByName(name); ok {
		return r.Interval
	}
	return 0
}
