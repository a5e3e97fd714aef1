package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// RegistryPartitionCount is the number of worker-registry partitions: a
// hash of the worker instance id, 256 in FlowFabric whatever its flow
// partition count.
const RegistryPartitionCount = 256

// WorkerRegistryTTL deletes worker registrations whose heartbeat is older
// than their liveness TTL, with a ttl_swept event: FlowFabric's registry TTL
// sweep, every 30 s. Registrations belong to no tenant's fleet: every
// namespace is swept, whatever the filter, as in FlowFabric.
var WorkerRegistryTTL = define[jobs.WorkerRegistryTTLTickArgs, jobs.WorkerRegistryTTLScanArgs](Reconciler{
	Name:       "worker_registry_ttl",
	Interval:   30 * time.Second,
	Due:        store.StaleWorkers,
	AllTenants: true,
	Lookahead:  true,
	Partitions: func(Config) int { return RegistryPartitionCount },
	Tables:     []string{"ff_worker_registry", "ff_worker_registry_event"},
}, func(p int16, x store.DueRow) jobs.WorkerSweepArgs {
	return jobs.WorkerSweepArgs{Partition: p, Namespace: x.ID, WorkerInstanceID: x.ID2}
}, func(d *deps) river.Worker[jobs.WorkerSweepArgs] {
	return &workerSweepWorker{d: d, sweeps: batcher(d, func(ctx context.Context, p int16, refs []store.WorkerRef) ([]store.WorkerSweepResult, error) {
		return store.SweepWorkers(ctx, d.cfg.Pool, p, refs, store.NowMs())
	})}
})

// workerSweepWorker sweeps one stale registration.
type workerSweepWorker struct {
	rowDefaults[jobs.WorkerSweepArgs]
	d      *deps
	sweeps *coalesce.Coalescer[int16, store.WorkerRef, store.WorkerSweepResult]
}

func (w *workerSweepWorker) Work(ctx context.Context, job *river.Job[jobs.WorkerSweepArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[store.WorkerRef, store.WorkerSweepResult]{
		r: WorkerRegistryTTL, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.sweeps, key: store.WorkerRef{Namespace: a.Namespace, WorkerInstanceID: a.WorkerInstanceID},
		changed: func(r store.WorkerSweepResult) bool { return r.Swept },
		found:   func(r store.WorkerSweepResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.Namespace, ID2: a.WorkerInstanceID},
		noop:    "worker registration renewed or gone under lock; nothing changed",
		attrs:   []any{"namespace", a.Namespace, "worker_instance_id", a.WorkerInstanceID},
	})
	if !ok {
		return err
	}
	logs.proc.Debug("swept stale worker registration", "event_written", res.EventWritten)
	logs.job.Info("swept stale worker registration", "event_written", res.EventWritten)
	return nil
}
