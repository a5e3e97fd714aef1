package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fetchwake"
	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// execKey is an execution's key: its partition and id.
type execKey struct {
	Partition   int16
	ExecutionID string
}

// randomKeys returns n fresh execution keys spread at random over the
// partitions, as the seed's workload spreads its executions.
func randomKeys(n int) []execKey {
	keys := make([]execKey, n)
	for i := range keys {
		keys[i] = execKey{Partition: int16(rand.IntN(jobs.PartitionCount)), ExecutionID: ffseed.NewUUID()}
	}
	return keys
}

// rawJSON is raw_fields for a series of rows that share it, marshalled
// once rather than per row.
func rawJSON(fields map[string]any) json.RawMessage {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(fmt.Sprintf("bench: raw_fields %v: %v", fields, err)) // maps of strings and numbers only
	}
	return b
}

// jitterMs is a random 0-999 ms with jitter (rows due over a second rather
// than all at one instant), 0 without.
func jitterMs(jitter bool) int64 {
	if !jitter {
		return 0
	}
	return rand.Int64N(1000)
}

// rowKey identifies a due row to the reference designs.
type rowKey struct {
	id string
	n  int32
}

// scenario is one reconciler's throughput benchmark: how to seed it and how
// the reference designs act on it.
type scenario struct {
	name string
	// configure adjusts our fleet (which runs every reconciler otherwise).
	configure func(*fleet.Config)
	// seed inserts due rows (deadline passed) and not-due rows.
	seed func(ctx context.Context, e *env, due, notDue int) error
	// remaining counts the due rows left.
	remaining func(ctx context.Context, db store.DB) (int, error)
	// scan is the seed's per-partition scan (batch 1000, oldest first).
	scan func(ctx context.Context, db store.DB, p int16, nowMs int64) ([]rowKey, error)
	// seedRow is the seed's per-row transaction body (its statements, in a
	// transaction the caller opens and commits).
	seedRow func(ctx context.Context, tx pgx.Tx, p int16, k rowKey, nowMs int64) error
	// setBased acts on every due row of a partition in one statement.
	setBased func(ctx context.Context, db store.DB, p int16, nowMs int64) error
}

// ThroughputResult compares our rate with the references, all on the same
// data in the same run.
type ThroughputResult struct {
	Reconciler string
	Commit     string // synchronous_commit of every design's transactions
	Due        int
	NotDue     int
	Ours       float64 // rows/s, first tick → last action committed
	SeedLoop   float64 // (a) partitions one after another, one tx per row, one connection
	Pool       float64 // (b) the same per-row transaction on the best pool size
	PoolSize   int
	SetBased   float64 // (c) one statement per partition
	// OursNoLogs is ours again without the per-job log line River UI
	// shows (fleet.Config.DisableJobLogs): what that line costs. Zero
	// when the benchmark's fleet has job logs off anyway.
	OursNoLogs float64
	// OursGIN and NoLogsGIN are what ours grew river_job's GIN indexes by,
	// in runs of their own (see ginDirect). Like OursNoLogs, measured
	// under the first commit mode only.
	OursGIN, NoLogsGIN ginSize
	OursStats          string
	// Alone is ours with this reconciler alone in the fleet (Ours runs the
	// default fleet, every reconciler ticking beside it).
	Alone    float64
	AloneCPU CPUCost
	// CPU per row of each design: the whole machine's (client, backends
	// and the server's background work) and this process's.
	OursCPU, SeedCPU, PoolCPU, SetCPU, NoLogsCPU CPUCost
}

const seedBatch = 1000

func (e *env) throughput(ctx context.Context, sc scenario) (ThroughputResult, error) {
	due, notDue := e.cfg.Due, e.cfg.Due*e.cfg.NotDueFactor
	res := ThroughputResult{Reconciler: sc.name, Due: due, NotDue: notDue}

	prepare := func() error {
		if err := e.reset(ctx); err != nil {
			return err
		}
		if err := sc.seed(ctx, e, due, notDue); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		if err := e.settle(ctx, false); err != nil {
			return err
		}
		return nil
	}
	remaining := func(ctx context.Context) (int, error) {
		n, err := sc.remaining(ctx, e.pool)
		if err != nil {
			return 0, fmt.Errorf("count remaining due rows: %w", err)
		}
		return n, nil
	}

	// (ours) one fleet process with every reconciler enabled.
	if err := prepare(); err != nil {
		return res, err
	}
	e.progress("throughput %s: ours (%d due, %d not due)", sc.name, due, notDue)
	fc := withCommit(e.fleetConfig(), e.commit)
	if sc.configure != nil {
		sc.configure(&fc)
	}
	rate, stats, oursCPU, err := e.runOurs(ctx, fc, sc.name, due, remaining)
	if err != nil {
		return res, err
	}
	res.Ours, res.OursStats, res.OursCPU = rate, stats, oursCPU
	// Only the run above is profiled (--cpu-profile): the runs below would
	// overwrite its profile.
	prof := e.cfg.CPUProfile
	e.cfg.CPUProfile = ""
	defer func() { e.cfg.CPUProfile = prof }()

	// (ours, alone) the same with this reconciler alone in the fleet.
	if err := prepare(); err != nil {
		return res, err
	}
	e.progress("throughput %s: ours alone", sc.name)
	r, ok := workers.ByName(sc.name)
	if !ok {
		return res, fmt.Errorf("no reconciler %q", sc.name)
	}
	alone := fc
	alone.Reconcilers = map[string]time.Duration{sc.name: cmp.Or(fc.Reconcilers[sc.name], r.Interval)}
	if res.Alone, _, res.AloneCPU, err = e.runOurs(ctx, alone, sc.name, due, remaining); err != nil {
		return res, err
	}
	e.progress("throughput %s: alone %.0f/s, CPU per row %s", sc.name, res.Alone, res.AloneCPU)

	if e.rowCosts && !fc.DisableJobLogs {
		if err := prepare(); err != nil {
			return res, err
		}
		e.progress("throughput %s: ours without job logs", sc.name)
		nl := fc
		nl.DisableJobLogs = true
		if res.OursNoLogs, _, res.NoLogsCPU, err = e.runOurs(ctx, nl, sc.name, due, remaining); err != nil {
			return res, err
		}
		e.progress("throughput %s: without job logs %.0f/s, CPU per row %s", sc.name, res.OursNoLogs, res.NoLogsCPU)
		for _, run := range []struct {
			fc  fleet.Config
			gin *ginSize
		}{{fc, &res.OursGIN}, {nl, &res.NoLogsGIN}} {
			if err := prepare(); err != nil {
				return res, err
			}
			e.progress("throughput %s: river_job's GIN growth (job logs %v)", sc.name, !run.fc.DisableJobLogs)
			if *run.gin, err = e.ginGrowth(ctx, func() error {
				_, _, _, err := e.runOurs(ctx, run.fc, sc.name, due, remaining)
				return err
			}); err != nil {
				return res, err
			}
		}
	}
	if e.cfg.OursOnly {
		e.progress("throughput %s: ours %.0f/s, CPU per row %s", sc.name, res.Ours, res.OursCPU)
		return res, nil
	}

	// (a) the seed's loop.
	if err := prepare(); err != nil {
		return res, err
	}
	// The loop's connection and the one counting what is left.
	if err := warm(ctx, e.pool, 2, sc.name); err != nil {
		return res, err
	}
	e.progress("throughput %s: seed loop", sc.name)
	cpu := sampleCPU()
	if res.SeedLoop, err = e.runSeedLoop(ctx, sc, due, remaining); err != nil {
		return res, err
	}
	res.SeedCPU = cpu.per(due)

	// (b) per-row transactions on a pool.
	for _, size := range e.cfg.PoolSizes {
		if err := prepare(); err != nil {
			return res, err
		}
		// The workers', the scanning one and the one counting what is left.
		if err := warm(ctx, e.pool, size+2, sc.name); err != nil {
			return res, err
		}
		e.progress("throughput %s: per-row pool of %d", sc.name, size)
		cpu := sampleCPU()
		r, err := e.runPerRow(ctx, sc, size, due, remaining)
		if err != nil {
			return res, err
		}
		if r > res.Pool {
			res.Pool, res.PoolSize, res.PoolCPU = r, size, cpu.per(due)
		}
	}

	// (c) set-based.
	if err := prepare(); err != nil {
		return res, err
	}
	if err := warm(ctx, e.pool, 2, sc.name); err != nil {
		return res, err
	}
	e.progress("throughput %s: set-based", sc.name)
	cpu = sampleCPU()
	start := time.Now()
	now := store.NowMs()
	for p := range int16(jobs.PartitionCount) {
		if err := sc.setBased(ctx, e.pool, p, now); err != nil {
			return res, err
		}
	}
	if n, err := remaining(ctx); err != nil || n != 0 {
		return res, fmt.Errorf("set-based left %d rows (%v)", n, err)
	}
	res.SetBased, res.SetCPU = float64(due)/time.Since(start).Seconds(), cpu.per(due)
	e.progress("throughput %s: ours %.0f/s, seed %.0f/s, pool(%d) %.0f/s, set %.0f/s",
		sc.name, res.Ours, res.SeedLoop, res.PoolSize, res.Pool, res.SetBased)
	e.progress("throughput %s: CPU per row: ours %s, seed %s, pool %s, set %s",
		sc.name, res.OursCPU, res.SeedCPU, res.PoolCPU, res.SetCPU)
	return res, nil
}

// runOurs starts one fleet process, its connections warmed (see warm), and
// measures from its first tick to the moment its last row action committed,
// and the CPU per row from the fleet's start. Progress is read from the process's
// own counters: polling a count over 256 partitions every few milliseconds
// would take ~1,000 locks each time and slow down what it measures. The
// database is asked once at the end that nothing is left.
func (e *env) runOurs(ctx context.Context, fc fleet.Config, reconciler string, due int, remaining func(context.Context) (int, error)) (float64, string, CPUCost, error) {
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return 0, "", CPUCost{}, fmt.Errorf("fleet: %w", err)
	}
	defer f.Close()
	if err := e.warmFleet(ctx, f, reconciler); err != nil {
		return 0, "", CPUCost{}, err
	}
	cpu := sampleCPU()
	if err := f.Start(ctx); err != nil {
		return 0, "", CPUCost{}, fmt.Errorf("start fleet: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
	}()
	stopProfile, err := e.startCPUProfile(reconciler + "-" + cmp.Or(e.commit, "default"))
	if err != nil {
		return 0, "", CPUCost{}, err
	}
	defer stopProfile()
	counters := f.Workers.Stats().For(reconciler)
	deadline := time.Now().Add(15 * time.Minute)
	var (
		end     time.Time
		cpuCost CPUCost
	)
	for {
		if counters.Applied.Load() >= int64(due) {
			// The CPU is read with the end, before the check below: that
			// count reads every partition and is the benchmark's, not ours.
			end = time.Now()
			if cpuCost, err = cpu.perByPool(ctx, e.pool, due); err != nil {
				return 0, "", CPUCost{}, err
			}
			n, err := remaining(ctx)
			if err != nil {
				return 0, "", CPUCost{}, err
			}
			if n == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			return 0, "", CPUCost{}, fmt.Errorf("%d of %d rows applied after 15 minutes", counters.Applied.Load(), due)
		}
		select {
		case <-ctx.Done():
			return 0, "", CPUCost{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	var first time.Time
	if err := e.pool.QueryRow(ctx, `SELECT min(attempted_at) FROM river.river_job WHERE kind = $1`,
		"ff."+reconciler+".tick").Scan(&first); err != nil {
		return 0, "", CPUCost{}, fmt.Errorf("first tick: %w", err)
	}
	return float64(due) / end.Sub(first).Seconds(), statsLine(counters.Snapshot(), f.Waker), cpuCost, nil
}

// statsLine is what our process did, for the report.
func statsLine(st workers.Snapshot, w *fetchwake.Waker) string {
	var wakes int64
	if w != nil {
		wakes = w.Sent()
	}
	return fmt.Sprintf("ticks %d, partitions skipped as busy %d (rescanned %d), scans %d (follow-ups %d, continued %d), enqueued %d (ahead of the deadline %d), "+
		"already queued %d, applied %d, no-ops %d, snoozes %d, wake-ups %d, errors %d",
		st.Ticks, st.PartitionsBusy, st.BusyRescans, st.Scans, st.FollowUpScans, st.Continuations, st.Enqueued, st.EnqueuedAhead, st.AlreadyQueued,
		st.Applied, st.NoOps, st.Snoozes, wakes, st.Errors)
}

// runSeedLoop is the seed's design exactly: one connection walks the
// partitions one after another, scanning each and acting on its rows one
// transaction at a time.
func (e *env) runSeedLoop(ctx context.Context, sc scenario, due int, remaining func(context.Context) (int, error)) (float64, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	start := time.Now()
	for {
		for p := range int16(jobs.PartitionCount) {
			now := store.NowMs()
			keys, err := sc.scan(ctx, conn, p, now)
			if err != nil {
				return 0, err
			}
			for _, k := range keys {
				if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return sc.seedRow(ctx, tx, p, k, now) }); err != nil {
					return 0, err
				}
			}
		}
		n, err := remaining(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return float64(due) / time.Since(start).Seconds(), nil
		}
	}
}

// runPerRow is the seed's per-row transaction with `workers` connections: partitions are
// scanned one after another, and each due row is acted on in its own
// transaction by one of the workers (one worker is the seed's loop itself).
func (e *env) runPerRow(ctx context.Context, sc scenario, workers, due int, remaining func(context.Context) (int, error)) (float64, error) {
	start := time.Now()
	type item struct {
		p int16
		k rowKey
	}
	var failed atomic.Int64
	var firstErr error
	var errOnce sync.Once
	for {
		now := store.NowMs()
		items := make(chan item, 1024)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := e.pool.Acquire(ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					for range items {
					}
					return
				}
				defer conn.Release()
				for it := range items {
					err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return sc.seedRow(ctx, tx, it.p, it.k, now) })
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { firstErr = err })
					}
				}
			}()
		}
		scanConn, err := e.pool.Acquire(ctx)
		if err != nil {
			close(items)
			wg.Wait()
			return 0, err
		}
		for p := range int16(jobs.PartitionCount) {
			keys, err := sc.scan(ctx, scanConn, p, now)
			if err != nil {
				scanConn.Release()
				close(items)
				wg.Wait()
				return 0, err
			}
			for _, k := range keys {
				items <- item{p, k}
			}
		}
		scanConn.Release()
		close(items)
		wg.Wait()
		if firstErr != nil {
			return 0, fmt.Errorf("%d row transactions failed, first: %w", failed.Load(), firstErr)
		}
		n, err := remaining(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
	}
	return float64(due) / time.Since(start).Seconds(), nil
}

// startCPUProfile starts a Go CPU profile of this process into
// <CPUProfile>-<name>.pprof when profiling is asked for; the returned
// function stops it.
func (e *env) startCPUProfile(name string) (stop func(), err error) {
	if e.cfg.CPUProfile == "" {
		return func() {}, nil
	}
	pf, err := os.Create(e.cfg.CPUProfile + "-" + name + ".pprof")
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); pf.Close() }, nil
}
