package jobs

import (
	"errors"

	"github.com/riverqueue/river"
)

// Worker registry TTL: registrations whose heartbeat is older than their
// liveness TTL are deleted, with a ttl_swept event. Their partitions are the
// registry's own (a hash of the worker instance id). Kinds are stored in
// river_job.kind: never rename them.
const (
	KindWorkerRegistryTTLTick = "ff.worker_registry_ttl.tick"
	KindWorkerRegistryTTLScan = "ff.worker_registry_ttl.scan"
	KindWorkerSweep           = "ff.worker_registry_ttl.sweep"
)

// WorkerRegistryTTLTickArgs is the periodic worker-registry TTL tick.
type WorkerRegistryTTLTickArgs struct{}

// Kind implements river.JobArgs.
func (WorkerRegistryTTLTickArgs) Kind() string { return KindWorkerRegistryTTLTick }

// WorkerRegistryTTLScanArgs scans one registry partition for stale
// registrations.
type WorkerRegistryTTLScanArgs struct{ ScanArgs }

// Kind implements river.JobArgs.
func (WorkerRegistryTTLScanArgs) Kind() string { return KindWorkerRegistryTTLScan }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (WorkerRegistryTTLScanArgs) InsertOpts() river.InsertOpts { return scanOpts() }

// WorkerSweepArgs sweeps one stale registration.
type WorkerSweepArgs struct {
	Partition        int16  `json:"partition" river:"unique"`
	Namespace        string `json:"namespace" river:"unique"`
	WorkerInstanceID string `json:"worker_instance_id" river:"unique"`
	// DeadlineMs is an optional deadline (Unix ms; 0: none), not part of
	// the unique key, which a job started before it waits for; the scans
	// leave it out: see AttemptExpireArgs.DeadlineMs.
	DeadlineMs int64 `json:"deadline_ms,omitempty"`
}

// Kind implements river.JobArgs.
func (WorkerSweepArgs) Kind() string { return KindWorkerSweep }

// InsertOpts implements river.JobArgsWithInsertOpts.
func (WorkerSweepArgs) InsertOpts() river.InsertOpts { return rowOpts() }

// Validate implements Validator.
func (a WorkerSweepArgs) Validate() error {
	if err := ValidatePartition(int(a.Partition)); err != nil {
		return err
	}
	if a.WorkerInstanceID == "" {
		return errors.New("missing worker_instance_id")
	}
	return nil
}
