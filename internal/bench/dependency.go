package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// DependencyResult is the dependency section: dispatch throughput against
// FlowFabric's loop and a set-based floor on the same data, how long a chain
// of skips takes to drain, and commit → dispatch lateness with the fleet as
// the primary dispatcher.
type DependencyResult struct {
	Events, Edges int
	// Events per second (each with its edges), first tick → last dispatch.
	Ours, FFLoop, SetBased float64
	OursCPU, FFCPU, SetCPU CPUCost
	OursStats              string
	ChainHops              int
	ChainOurs, ChainFF     time.Duration
	ChainFFInterval        time.Duration // interval and threshold FlowFabric's loop ran with
	PrimaryEvents          int
	PrimaryRate            int
	PrimaryP50, PrimaryP99 time.Duration
	PrimaryMax             time.Duration
	PrimaryStats           string
	// PrimaryStages splits the primary run's time per event by its
	// dispatch job (primaryStagesSQL).
	PrimaryStages []Stage
	PrimaryServer string // the server's settings the primary run ran with
	// PrimaryCPU is the primary run's CPU per event, feed to drain, the
	// feed's inserts included (the bench pool).
	PrimaryCPU CPUCost
}

// seedDependency inserts n undispatched completion events committed an hour
// ago, each of an upstream with 1-3 edges (2 on average) to downstreams of
// its own flow blocked on an all_of group of that one upstream, over every
// partition; and notDue events already dispatched.
func seedDependency(ctx context.Context, e *env, n, notDue int) (edges int, err error) {
	committed := store.NowMs() - time.Hour.Milliseconds()
	var ups, downs []ffseed.Exec
	var edgeRows []ffseed.Edge
	var groups []ffseed.EdgeGroup
	var events []ffseed.CompletionEvent
	for g := 1; g <= n; g++ {
		p, flow := int16(g%256), ffseed.NewUUID()
		up := ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "bench", LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: "completed",
			AttemptState: "attempt_terminal", RawFields: benchRaw}
		ups = append(ups, up)
		for range 1 + g%3 {
			down := ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "bench", LifecyclePhase: "blocked",
				OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting",
				AttemptState: "pending", RawFields: benchRaw}
			downs = append(downs, down)
			edgeRows = append(edgeRows, ffseed.Edge{Partition: p, FlowID: flow, UpstreamEID: up.ID, DownstreamEID: down.ID,
				Policy: ffseed.AllOf})
			groups = append(groups, ffseed.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down.ID, Policy: ffseed.AllOf,
				Running: 1})
		}
		events = append(events, ffseed.CompletionEvent{Partition: p, ExecutionID: up.ID, FlowID: flow, Outcome: "success",
			OccurredAtMs: 1, CommittedAtMs: committed})
	}
	err = errors.Join(ffseed.InsertMany(ctx, e.pool, ups), ffseed.InsertMany(ctx, e.pool, downs),
		ffseed.InsertMany(ctx, e.pool, edgeRows), ffseed.InsertMany(ctx, e.pool, groups), ffseed.InsertMany(ctx, e.pool, events))
	if err != nil {
		return 0, fmt.Errorf("seed completion events: %w", err)
	}
	if err := ffseed.InsertSeries(ctx, e.pool, notDue, func(i int) ffseed.CompletionEvent {
		return ffseed.CompletionEvent{Partition: int16((i + 1) % 256), ExecutionID: ffseed.NewUUID(), FlowID: ffseed.NewUUID(),
			Outcome: "success", OccurredAtMs: 1, CommittedAtMs: committed, DispatchedAtMs: &committed}
	}); err != nil {
		return 0, fmt.Errorf("seed dispatched events: %w", err)
	}
	return len(downs), nil
}

func undispatched(ctx context.Context, db store.DB) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM ff_completion_event WHERE dispatched_at_ms IS NULL`).Scan(&n)
	return n, err
}

// dependency runs the section.
func (e *env) dependency(ctx context.Context) (DependencyResult, error) {
	n := cmp.Or(e.cfg.DependencyEvents, 5_000)
	notDue := n * e.cfg.NotDueFactor
	res := DependencyResult{Events: n}
	prepare := func() error {
		if err := e.reset(ctx); err != nil {
			return err
		}
		start := time.Now()
		edges, err := seedDependency(ctx, e, n, notDue)
		if err != nil {
			return err
		}
		e.seeded("dependency", start)
		res.Edges = edges
		return e.settle(ctx, false)
	}
	remaining := func(ctx context.Context) (int, error) { return undispatched(ctx, e.pool) }

	// (ours) one fleet process, every reconciler on.
	if err := prepare(); err != nil {
		return res, err
	}
	e.progress("dependency: ours (%d events, %d edges)", n, res.Edges)
	rate, stats, cpu, err := e.runOurs(ctx, e.fleetConfig(), workers.Dependency.Name, n, remaining)
	if err != nil {
		return res, err
	}
	res.Ours, res.OursStats, res.OursCPU = rate, stats, cpu

	// (a) FlowFabric's reconcile_tick and dispatch_completion as written
	// (not with --ours-only: minutes at its rate).
	if e.cfg.OursOnly {
		e.progress("dependency: FlowFabric's loop skipped (--ours-only)")
	} else if err := e.dependencyFF(ctx, n, prepare, &res); err != nil {
		return res, err
	}

	// (c) set-based, one statement per partition (all_of groups of one
	// upstream, this data's shape).
	if err := prepare(); err != nil {
		return res, err
	}
	if err := warm(ctx, e.pool, 2, workers.Dependency.Name); err != nil {
		return res, err
	}
	e.progress("dependency: set-based")
	s := sampleCPU()
	start := time.Now()
	now := store.NowMs()
	for p := range int16(jobs.PartitionCount) {
		if _, err := e.pool.Exec(ctx, setBasedDispatchSQL, p, now); err != nil {
			return res, fmt.Errorf("set-based dispatch of partition %d: %w", p, err)
		}
	}
	if left, err := remaining(ctx); err != nil || left != 0 {
		return res, fmt.Errorf("set-based left %d events (%v)", left, err)
	}
	res.SetBased, res.SetCPU = float64(n)/time.Since(start).Seconds(), s.per(n)
	e.progress("dependency: ours %.0f/s, FlowFabric %.0f/s, set %.0f/s; CPU per event ours %s, FlowFabric %s, set %s",
		res.Ours, res.FFLoop, res.SetBased, res.OursCPU, res.FFCPU, res.SetCPU)

	if err := e.dependencyChain(ctx, &res); err != nil {
		return res, err
	}
	if err := e.dependencyPrimary(ctx, &res); err != nil {
		return res, err
	}
	return res, e.reset(ctx)
}

// dependencyFF runs FlowFabric's loop over the section's data.
func (e *env) dependencyFF(ctx context.Context, n int, prepare func() error, res *DependencyResult) error {
	if err := prepare(); err != nil {
		return err
	}
	if err := warm(ctx, e.pool, 2, workers.Dependency.Name); err != nil {
		return err
	}
	e.progress("dependency: FlowFabric's loop")
	s := sampleCPU()
	start := time.Now()
	for {
		left, err := e.ffDependencyTick(ctx, 15*time.Second)
		if err != nil {
			return err
		}
		if left == 0 {
			break
		}
	}
	res.FFLoop, res.FFCPU = float64(n)/time.Since(start).Seconds(), s.per(n)
	return nil
}

// setBasedDispatchSQL claims a partition's due events and advances their
// all_of groups in one statement. $1 partition, $2 now.
const setBasedDispatchSQL = `
WITH c AS (
    UPDATE ff_completion_event SET dispatched_at_ms = $2
     WHERE partition_key = $1 AND dispatched_at_ms IS NULL AND committed_at_ms < $2
    RETURNING execution_id, flow_id, outcome
), e AS (
    SELECT e.flow_id, e.downstream_eid, count(*) FILTER (WHERE c.outcome = 'success') AS s, count(*) AS n
      FROM c JOIN ff_edge e ON e.partition_key = $1 AND e.flow_id = c.flow_id AND e.upstream_eid = c.execution_id
     GROUP BY 1, 2
), g AS (
    UPDATE ff_edge_group g SET success_count = g.success_count + e.s, fail_count = g.fail_count + e.n - e.s,
           running_count = greatest(g.running_count - e.n, 0)
      FROM e WHERE g.partition_key = $1 AND g.flow_id = e.flow_id AND g.downstream_eid = e.downstream_eid
    RETURNING g.downstream_eid, g.success_count = g.success_count + g.fail_count + g.skip_count + g.running_count AS ok
)
UPDATE ff_exec_core x SET eligibility_state = 'eligible_now',
       lifecycle_phase = CASE WHEN x.lifecycle_phase = 'blocked' THEN 'runnable' ELSE x.lifecycle_phase END
  FROM g WHERE x.partition_key = $1 AND x.execution_id = g.downstream_eid AND g.ok
   AND x.lifecycle_phase NOT IN ('terminal', 'cancelled')`

// ffDependencyTick is FlowFabric's reconcile_tick (reconcilers/
// dependency.rs): one global scan of up to 1,000 events older than the
// threshold, event_id order, then dispatch_completion for each, one after
// another. It returns the undispatched events left.
func (e *env) ffDependencyTick(ctx context.Context, threshold time.Duration) (int, error) {
	rows, err := e.pool.Query(ctx, `SELECT event_id FROM ff_completion_event
		 WHERE dispatched_at_ms IS NULL AND committed_at_ms < $1 ORDER BY event_id ASC LIMIT 1000`,
		store.NowMs()-threshold.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("FlowFabric's dependency scan: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if err := e.ffDispatchCompletion(ctx, id); err != nil {
			return 0, err
		}
	}
	return undispatched(ctx, e.pool)
}

// ffDispatchCompletion is FlowFabric's dispatch_completion (dispatch.rs):
// the claim in its own autocommit statement, the edges, then each hop in a
// SERIALIZABLE transaction of its own, retried up to three times on
// contention. Only the all_of path the section's data takes, and the
// impossible path of the chain, are written out.
func (e *env) ffDispatchCompletion(ctx context.Context, id int64) error {
	var (
		p             int16
		exec, outcome string
		flow          *string
	)
	err := e.pool.QueryRow(ctx, `UPDATE ff_completion_event SET dispatched_at_ms = $2
		 WHERE event_id = $1 AND dispatched_at_ms IS NULL
		 RETURNING partition_key, execution_id::text, flow_id::text, outcome`, id, store.NowMs()).Scan(&p, &exec, &flow, &outcome)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && flow == nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("FlowFabric's claim: %w", err)
	}
	rows, err := e.pool.Query(ctx, `SELECT downstream_eid::text FROM ff_edge WHERE partition_key = $1 AND flow_id = $2 AND upstream_eid = $3`,
		p, *flow, exec)
	if err != nil {
		return err
	}
	downs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, d := range downs {
		for try := 0; ; try++ {
			err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
				return ffHop(ctx, tx, p, *flow, d, outcome)
			})
			var pgErr *pgconn.PgError
			if err == nil {
				break
			}
			if !errors.As(err, &pgErr) || !slices.Contains([]string{"40001", "40P01", "55P03"}, pgErr.Code) || try == 2 {
				return fmt.Errorf("FlowFabric's hop: %w", err)
			}
			time.Sleep(time.Duration(5<<try) * time.Millisecond)
		}
	}
	return nil
}

// ffHop is FlowFabric's advance_edge_group for all_of groups.
func ffHop(ctx context.Context, tx pgx.Tx, p int16, flow, down, outcome string) error {
	var s, f, k, r int32
	err := tx.QueryRow(ctx, `SELECT success_count, fail_count, skip_count, running_count FROM ff_edge_group
		 WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3 FOR UPDATE`, p, flow, down).Scan(&s, &f, &k, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if r > 0 {
		r--
	}
	switch outcome {
	case "success":
		s++
	case "skipped":
		k++
	default:
		f++
	}
	if _, err := tx.Exec(ctx, `UPDATE ff_edge_group SET success_count = $4, fail_count = $5, skip_count = $6, running_count = $7
		 WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`, p, flow, down, s, f, k, r); err != nil {
		return err
	}
	now := store.NowMs()
	total := s + f + k + r
	switch {
	case s == total && total > 0:
		_, err = tx.Exec(ctx, `UPDATE ff_exec_core SET eligibility_state = 'eligible_now',
			lifecycle_phase = CASE WHEN lifecycle_phase = 'blocked' THEN 'runnable' ELSE lifecycle_phase END
			WHERE partition_key = $1 AND execution_id = $2 AND lifecycle_phase NOT IN ('terminal', 'cancelled')`, p, down)
	case f+k > 0:
		var skipped string
		err = tx.QueryRow(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'terminal', eligibility_state = 'not_applicable',
			public_state = 'skipped', attempt_state = 'attempt_terminal', terminal_at_ms = COALESCE(terminal_at_ms, $3)
			WHERE partition_key = $1 AND execution_id = $2 AND lifecycle_phase NOT IN ('terminal', 'cancelled')
			RETURNING execution_id::text`, p, down, now).Scan(&skipped)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, occurred_at_ms)
				VALUES ($1, $2, $3, 'skipped', $4)`, p, down, flow, now)
		}
	}
	return err
}

// seedChain inserts a failed upstream whose event is due and a chain of hops
// all_of downstreams, each blocked on the one before; it returns the last.
func seedChain(ctx context.Context, e *env, hops int) (last string, err error) {
	p, flow := int16(42), ffseed.NewUUID()
	execs := []ffseed.Exec{{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "bench", LifecyclePhase: "terminal",
		OwnershipState: "unowned", PublicState: "failed", AttemptState: "attempt_terminal", CreatedAtMs: 1}}
	event := ffseed.CompletionEvent{Partition: p, ExecutionID: execs[0].ID, FlowID: flow, Outcome: "failed", OccurredAtMs: 1,
		CommittedAtMs: store.NowMs() - time.Hour.Milliseconds()}
	var edges []ffseed.Edge
	var groups []ffseed.EdgeGroup
	for range hops {
		prev := execs[len(execs)-1].ID
		d := ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "bench", LifecyclePhase: "blocked",
			OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting",
			AttemptState: "pending", CreatedAtMs: 1}
		execs = append(execs, d)
		edges = append(edges, ffseed.Edge{Partition: p, FlowID: flow, UpstreamEID: prev, DownstreamEID: d.ID})
		groups = append(groups, ffseed.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: d.ID, Running: 1})
	}
	err = errors.Join(ffseed.InsertMany(ctx, e.pool, execs), ffseed.InsertMany(ctx, e.pool, edges),
		ffseed.InsertMany(ctx, e.pool, groups), ffseed.Insert(ctx, e.pool, event))
	return execs[len(execs)-1].ID, err
}

// chainDone returns when the skipped event of last was dispatched.
func chainDone(ctx context.Context, e *env, last string) (bool, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ff_completion_event WHERE execution_id = $1 AND dispatched_at_ms IS NOT NULL`, last).Scan(&n)
	return n > 0, err
}

// dependencyChain measures a chain of five skips: ours (a fleet at the
// default interval and threshold, from its first dispatch to the last skip
// event dispatched) and FlowFabric's loop at a 1 s interval and a 1 s
// threshold (the module's own test value; its supervisor runs 15 s and 15 s).
func (e *env) dependencyChain(ctx context.Context, res *DependencyResult) error {
	res.ChainHops, res.ChainFFInterval = 5, time.Second
	if err := e.reset(ctx); err != nil {
		return err
	}
	last, err := seedChain(ctx, e, res.ChainHops)
	if err != nil {
		return fmt.Errorf("seed chain: %w", err)
	}
	e.progress("dependency: a chain of %d skips, ours", res.ChainHops)
	f, err := fleet.New(ctx, e.fleetConfig())
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Start(ctx); err != nil {
		return err
	}
	if _, err := waitDrained(ctx, time.Minute, func(ctx context.Context) (int, error) {
		done, err := chainDone(ctx, e, last)
		if done {
			return 0, err
		}
		return 1, err
	}); err != nil {
		return fmt.Errorf("ours: chain not drained: %w", err)
	}
	var first, lastAt int64
	if err := e.pool.QueryRow(ctx, `SELECT min(dispatched_at_ms), max(dispatched_at_ms) FROM ff_completion_event`).Scan(&first, &lastAt); err != nil {
		return err
	}
	res.ChainOurs = time.Duration(lastAt-first) * time.Millisecond
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	_ = f.Stop(stopCtx)
	cancel()

	if err := e.reset(ctx); err != nil {
		return err
	}
	if last, err = seedChain(ctx, e, res.ChainHops); err != nil {
		return err
	}
	e.progress("dependency: a chain of %d skips, FlowFabric's loop (interval and threshold %s)", res.ChainHops, res.ChainFFInterval)
	start := time.Now()
	for {
		if _, err := e.ffDependencyTick(ctx, res.ChainFFInterval); err != nil {
			return err
		}
		done, err := chainDone(ctx, e, last)
		if err != nil {
			return err
		}
		if done {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return errors.New("FlowFabric's loop: chain not drained in 5 minutes")
		}
		time.Sleep(res.ChainFFInterval)
	}
	if err := e.pool.QueryRow(ctx, `SELECT min(dispatched_at_ms), max(dispatched_at_ms) FROM ff_completion_event`).Scan(&first, &lastAt); err != nil {
		return err
	}
	res.ChainFF = time.Duration(lastAt-first) * time.Millisecond
	e.progress("dependency: chain of %d: ours %s, FlowFabric %s", res.ChainHops, res.ChainOurs, res.ChainFF)
	return nil
}

// dependencyPrimary feeds completion events (one edge each) at a steady
// rate into a fleet that is the primary dispatcher (no stale threshold) and
// reports each event's dispatched_at_ms − committed_at_ms.
func (e *env) dependencyPrimary(ctx context.Context, res *DependencyResult) error {
	if err := e.reset(ctx); err != nil {
		return err
	}
	res.PrimaryRate = e.cfg.PrimaryRate
	if err := e.pool.QueryRow(ctx, `SELECT format('synchronous_commit %s, fsync %s, shared_buffers %s, max_connections %s',
		current_setting('synchronous_commit'), current_setting('fsync'), current_setting('shared_buffers'),
		current_setting('max_connections'))`).Scan(&res.PrimaryServer); err != nil {
		return err
	}
	fc := e.fleetConfig()
	fc.Settings = workers.Values{workers.DependencyStaleThreshold: workers.Off}
	// The dependency reconciler alone, as each lateness stream runs its
	// own: with every reconciler on, flow_summary's tick every 15 s
	// projects the ~15,000 flows the feed made meanwhile, and its burst
	// held the dispatches back ~300 ms (docs/performance.md).
	fc.Reconcilers = map[string]time.Duration{workers.Dependency.Name: workers.Dependency.Interval}
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
	}()
	if err := e.warmFleet(ctx, f, workers.Dependency.Name); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the listener's LISTEN
	e.progress("dependency: primary dispatch, %d events/s for %s", res.PrimaryRate, e.cfg.LatenessFor)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	per := max(res.PrimaryRate/10, 1)
	cpu := sampleCPU()
	end := time.Now().Add(e.cfg.LatenessFor)
	for time.Now().Before(end) {
		<-tick.C
		if _, err := seedDependencyFresh(ctx, e, per); err != nil {
			return err
		}
		res.PrimaryEvents += per
	}
	if _, err := waitDrained(ctx, time.Minute, func(ctx context.Context) (int, error) { return undispatched(ctx, e.pool) }); err != nil {
		return err
	}
	if res.PrimaryCPU, err = cpu.perByPool(ctx, e.pool, res.PrimaryEvents); err != nil {
		return err
	}
	lat, err := collectFloats(e.pool.Query(ctx, `SELECT (dispatched_at_ms - committed_at_ms)::float8 FROM ff_completion_event`))
	if err != nil {
		return err
	}
	if len(lat) == 0 {
		return errors.New("primary dispatch: no event measured")
	}
	sort.Float64s(lat)
	ms := func(q float64) time.Duration {
		return time.Duration(lat[min(len(lat)-1, int(q*float64(len(lat))))] * float64(time.Millisecond))
	}
	res.PrimaryP50, res.PrimaryP99, res.PrimaryMax = ms(0.5), ms(0.99), ms(1)
	if res.PrimaryStages, err = e.stagesOf(ctx, primaryStagesSQL); err != nil {
		return err
	}
	res.PrimaryStats = statsLine(f.Workers.Stats().For(workers.Dependency.Name).Snapshot(), f.Waker)
	e.progress("dependency: primary p50 %s, p99 %s, max %s", res.PrimaryP50, res.PrimaryP99, res.PrimaryMax)
	return nil
}

// primaryStagesSQL splits each primary-dispatched event's commit →
// dispatched time by the dispatch job that claimed it (the first job of the
// event: a tick may enqueue another, which finds it claimed): commit →
// enqueued (the notification, the listener's lookup and its insert), the
// job's wait in the queue (created_at → attempted_at) and its wait for a
// dispatch transaction (attempted_at → dispatched_at_ms, the time the
// transaction that claims it starts: internal/coalesce's wait).
const primaryStagesSQL = `
WITH j AS (
    SELECT DISTINCT ON (c.event_id) c.committed_at_ms, c.dispatched_at_ms,
           extract(epoch FROM r.created_at) * 1000 AS created_ms, extract(epoch FROM r.attempted_at) * 1000 AS attempted_ms
      FROM ff_completion_event c
      JOIN river.river_job r ON r.kind = 'ff.dependency.dispatch'
       AND (r.args->>'partition')::smallint = c.partition_key AND (r.args->>'event_id')::bigint = c.event_id
     WHERE r.attempted_at IS NOT NULL AND c.dispatched_at_ms IS NOT NULL
     ORDER BY c.event_id, r.id
), s AS (
    SELECT 'commit → enqueued' AS step, created_ms - committed_at_ms AS ms FROM j
    UNION ALL SELECT 'queue wait', attempted_ms - created_ms FROM j
    UNION ALL SELECT 'attempted → claimed', dispatched_at_ms - attempted_ms FROM j
)
SELECT 'ff.dependency.dispatch', step, count(*)::int,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8
  FROM s GROUP BY step ORDER BY min(CASE step WHEN 'commit → enqueued' THEN 1 WHEN 'queue wait' THEN 2 ELSE 3 END)`

// seedDependencyFresh is seedDependency's shape, committed now, one edge
// each, in one transaction.
func seedDependencyFresh(ctx context.Context, e *env, n int) (int, error) {
	keys := randomKeys(n)
	flows, downs := make([]string, n), make([]string, n)
	for i := range keys {
		flows[i], downs[i] = ffseed.NewUUID(), ffseed.NewUUID()
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return errors.Join(
			ffseed.InsertSeries(ctx, tx, n, func(i int) ffseed.Exec {
				return ffseed.Exec{Partition: keys[i].Partition, ID: downs[i], FlowID: flows[i], LaneID: "bench",
					LifecyclePhase: "blocked", OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies",
					PublicState: "waiting", AttemptState: "pending", CreatedAtMs: 1}
			}),
			ffseed.InsertSeries(ctx, tx, n, func(i int) ffseed.Edge {
				return ffseed.Edge{Partition: keys[i].Partition, FlowID: flows[i], UpstreamEID: keys[i].ExecutionID, DownstreamEID: downs[i]}
			}),
			ffseed.InsertSeries(ctx, tx, n, func(i int) ffseed.EdgeGroup {
				return ffseed.EdgeGroup{Partition: keys[i].Partition, FlowID: flows[i], DownstreamEID: downs[i], Running: 1}
			}),
			ffseed.InsertSeries(ctx, tx, n, func(i int) ffseed.CompletionEvent {
				return ffseed.CompletionEvent{Partition: keys[i].Partition, ExecutionID: keys[i].ExecutionID, FlowID: flows[i],
					OccurredAtMs: 1}
			}))
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
