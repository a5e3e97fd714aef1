package bench

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
)

// River's ceiling: the throughput of jobs that do nothing, enqueued and
// worked as the fleet's are: a partition "scan" job per partition on the
// control queue, each inserting its partition's row jobs in one
// transaction (synchronous_commit off, as a scan does), unique by args
// among unfinished jobs, worked by the fleet's own River client (its
// queues, workers, fetch cooldown, pools and wake-ups). What is left of a
// row's time in ours is our work: the tick, the scans' reads and the row
// statements.
//
// The same run with our row's shape (shaped) tells River's share of what a
// row of ours costs beyond a no-op job: its row jobs carry lease expiry's
// args (an execution id no other job has) and write ours' job log line,
// and still do nothing.

type noopScanArgs struct {
	Partition int16 `json:"partition" river:"unique"`
	Rows      int   `json:"rows"`
	Shaped    bool  `json:"shaped,omitempty"`
}

func (noopScanArgs) Kind() string { return "bench.noop.scan" }

func (noopScanArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: jobs.QueueControl, MaxAttempts: jobs.ScanMaxAttempts,
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: jobs.UnfinishedStates}}
}

type noopRowArgs struct {
	Partition int16 `json:"partition" river:"unique"`
	Row       int   `json:"row" river:"unique"`
}

func (noopRowArgs) Kind() string { return "bench.noop.row" }

func (noopRowArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: jobs.QueueRows, MaxAttempts: jobs.RowMaxAttempts,
		UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: jobs.UnfinishedStates}}
}

// noopShapedArgs are lease expiry's row args (jobs.LeaseReleaseArgs) as
// its scans write them for a backlog (no deadline_ms), under a kind of the
// benchmark's.
type noopShapedArgs struct {
	Partition    int16  `json:"partition" river:"unique"`
	ExecutionID  string `json:"execution_id" river:"unique"`
	AttemptIndex int32  `json:"attempt_index" river:"unique"`
}

func (noopShapedArgs) Kind() string { return "bench.noop.shaped" }

func (noopShapedArgs) InsertOpts() river.InsertOpts { return noopRowArgs{}.InsertOpts() }

type noopScanWorker struct {
	river.WorkerDefaults[noopScanArgs]
	e *env
}

func (w *noopScanWorker) Work(ctx context.Context, job *river.Job[noopScanArgs]) error {
	params := make([]river.InsertManyParams, job.Args.Rows)
	for i := range params {
		if job.Args.Shaped {
			params[i] = river.InsertManyParams{Args: noopShapedArgs{Partition: job.Args.Partition, ExecutionID: uuid.NewString()}}
			continue
		}
		params[i] = river.InsertManyParams{Args: noopRowArgs{Partition: job.Args.Partition, Row: i}}
	}
	tx, err := w.e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit TO off`); err != nil {
		return err
	}
	if _, err := river.ClientFromContext[pgx.Tx](ctx).InsertManyTx(ctx, tx, params); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// noopRowWorker counts its jobs, as ours counts applied rows: the run ends
// when the last one has run, not when River's completer has recorded it.
type noopRowWorker struct {
	river.WorkerDefaults[noopRowArgs]
	ran *atomic.Int64
}

func (w noopRowWorker) Work(context.Context, *river.Job[noopRowArgs]) error {
	w.ran.Add(1)
	return nil
}

// noopShapedWorker does nothing but count its job and log ours' line for a
// released lease (the fleet's job log, when on).
type noopShapedWorker struct {
	river.WorkerDefaults[noopShapedArgs]
	ran *atomic.Int64
}

func (w noopShapedWorker) Work(ctx context.Context, _ *river.Job[noopShapedArgs]) error {
	if l, ok := riverlog.LoggerSafely(ctx); ok {
		l.Info("released expired lease", "execution_flipped", true, "execution_missing", false)
	}
	w.ran.Add(1)
	return nil
}

// riverCeiling runs due no-op row jobs (shaped: with our row's args and
// job log) through a fleet of no reconcilers and returns their rate, rows
// per second from the scans' insert to the last row job run, and the CPU
// they cost per job, measured as ours is (from the fleet's start to the
// last row), so that the two compare.
func (e *env) riverCeiling(ctx context.Context, due int, shaped bool) (float64, CPUCost, error) {
	if err := e.reset(ctx); err != nil {
		return 0, CPUCost{}, err
	}
	return e.runCeiling(ctx, due, shaped)
}

// riverCeilingGIN runs due no-op row jobs as riverCeiling does and returns
// what they grew river_job's GIN indexes by (see ginGrowth; the rate of
// such a run is not River's, and is not kept).
func (e *env) riverCeilingGIN(ctx context.Context, due int) (ginSize, error) {
	if err := e.reset(ctx); err != nil {
		return ginSize{}, err
	}
	return e.ginGrowth(ctx, func() error {
		_, _, err := e.runCeiling(ctx, due, false)
		return err
	})
}

// runCeiling is riverCeiling's run, its fleet stopped when it returns. With
// --cpu-profile it writes <prefix>-noop-<commit>.pprof, to set beside
// ours' profile.
func (e *env) runCeiling(ctx context.Context, due int, shaped bool) (float64, CPUCost, error) {
	fc := withCommit(e.fleetConfig(), e.commit)
	fc.Reconcilers = map[string]time.Duration{}
	var ran atomic.Int64
	fc.ExtraWorkers = func(ws *river.Workers) error {
		if err := river.AddWorkerSafely(ws, &noopScanWorker{e: e}); err != nil {
			return err
		}
		if err := river.AddWorkerSafely[noopShapedArgs](ws, noopShapedWorker{ran: &ran}); err != nil {
			return err
		}
		return river.AddWorkerSafely[noopRowArgs](ws, noopRowWorker{ran: &ran})
	}
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return 0, CPUCost{}, fmt.Errorf("fleet: %w", err)
	}
	defer f.Close()
	cpu := sampleCPU()
	if err := f.Start(ctx); err != nil {
		return 0, CPUCost{}, fmt.Errorf("start fleet: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
	}()
	// As a tick fans out: one scan per partition, the rows spread evenly.
	scans := make([]river.InsertManyParams, 256)
	for p := range scans {
		n := due / 256
		if p < due%256 {
			n++
		}
		scans[p] = river.InsertManyParams{Args: noopScanArgs{Partition: int16(p), Rows: n, Shaped: shaped}}
	}
	name := "noop-"
	if shaped {
		name = "noop-shaped-"
	}
	stopProfile, err := e.startCPUProfile(name + cmp.Or(e.commit, "default"))
	if err != nil {
		return 0, CPUCost{}, err
	}
	defer stopProfile()
	start := time.Now()
	if _, err := f.Client.InsertMany(ctx, scans); err != nil {
		return 0, CPUCost{}, fmt.Errorf("insert no-op scans: %w", err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for ran.Load() < int64(due) {
		if time.Now().After(deadline) {
			return 0, CPUCost{}, fmt.Errorf("%d of %d no-op row jobs ran after 10 minutes", ran.Load(), due)
		}
		select {
		case <-ctx.Done():
			return 0, CPUCost{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	rate := float64(due) / time.Since(start).Seconds()
	cost, err := cpu.perByPool(ctx, e.pool, due)
	if err != nil {
		return 0, CPUCost{}, err
	}
	return rate, cost, nil
}
