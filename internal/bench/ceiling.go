package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

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

type noopScanArgs struct {
	Partition int16 `json:"partition" river:"unique"`
	Rows      int   `json:"rows"`
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

type noopScanWorker struct {
	river.WorkerDefaults[noopScanArgs]
	e *env
}

func (w *noopScanWorker) Work(ctx context.Context, job *river.Job[noopScanArgs]) error {
	params := make([]river.InsertManyParams, job.Args.Rows)
	for i := range params {
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

// riverCeiling runs due no-op row jobs through a fleet of no reconcilers
// and returns their rate, rows per second from the scans' insert to the
// last row job completed.
func (e *env) riverCeiling(ctx context.Context, due int) (float64, error) {
	if err := e.reset(ctx); err != nil {
		return 0, err
	}
	return e.runCeiling(ctx, due)
}

// riverCeilingGIN runs due no-op row jobs as riverCeiling does and returns
// what they grew river_job's GIN indexes by (see ginGrowth; the rate of
// such a run is not River's, and is not kept).
func (e *env) riverCeilingGIN(ctx context.Context, due int) (ginSize, error) {
	if err := e.reset(ctx); err != nil {
		return ginSize{}, err
	}
	return e.ginGrowth(ctx, func() error {
		_, err := e.runCeiling(ctx, due)
		return err
	})
}

// runCeiling is riverCeiling's run, its fleet stopped when it returns.
func (e *env) runCeiling(ctx context.Context, due int) (float64, error) {
	fc := withCommit(e.fleetConfig(), e.commit)
	fc.Reconcilers = map[string]time.Duration{}
	var ran atomic.Int64
	fc.ExtraWorkers = func(ws *river.Workers) error {
		if err := river.AddWorkerSafely(ws, &noopScanWorker{e: e}); err != nil {
			return err
		}
		return river.AddWorkerSafely[noopRowArgs](ws, noopRowWorker{ran: &ran})
	}
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return 0, fmt.Errorf("fleet: %w", err)
	}
	defer f.Close()
	if err := f.Start(ctx); err != nil {
		return 0, fmt.Errorf("start fleet: %w", err)
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
		scans[p] = river.InsertManyParams{Args: noopScanArgs{Partition: int16(p), Rows: n}}
	}
	start := time.Now()
	if _, err := f.Client.InsertMany(ctx, scans); err != nil {
		return 0, fmt.Errorf("insert no-op scans: %w", err)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for ran.Load() < int64(due) {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d no-op row jobs ran after 10 minutes", ran.Load(), due)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return float64(due) / time.Since(start).Seconds(), nil
}
