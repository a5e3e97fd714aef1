package store

import (
	"context"
	"fmt"
)

// StaleWorkers are worker-registry rows whose heartbeat is older than their
// own liveness TTL (last_heartbeat_ms + liveness_ttl_ms < now, strictly).
// Worker registrations belong to no tenant's fleet (FlowFabric sweeps every
// namespace, whatever its filter), and their partitions are the registry's
// own (a hash of the worker instance id), 256 of them.
//
// The sum is taken in numeric and capped to the bigint range: in bigint,
// FlowFabric's sweep fails the whole partition at every tick on one row
// whose sum overflows; here such a row is simply never stale and the rest
// of its partition is swept.
//
// Index: none. FlowFabric's migrations index the registry by its key only,
// and no index can serve a sum of two columns without adding one to its
// table, which this project does not do. A probe or scan therefore reads
// its partition's registrations whole: O(live workers of the partition),
// which is the registry's whole size (rows are deleted as workers die or are
// swept), a handful per partition even for thousands of workers.
var StaleWorkers = &Due{
	What:  "stale worker registrations",
	From:  "ff_worker_registry r",
	At:    lapsedAtSQL("r"),
	ID:    Key{"r.namespace", "text"},
	ID2:   Key{"r.worker_instance_id", "text"},
	Index: "ff_worker_registry_pkey",
}

// lapsedAtSQL is when the registration aliased alias lapses, its heartbeat
// plus its TTL summed in numeric and capped to the bigint range (see
// StaleWorkers).
func lapsedAtSQL(alias string) string {
	return fmt.Sprintf("LEAST(GREATEST(%[1]s.last_heartbeat_ms::numeric + %[1]s.liveness_ttl_ms, -9223372036854775808), 9223372036854775807)::bigint", alias)
}

// WorkerRef names one registration of a registry partition.
type WorkerRef struct {
	Namespace, WorkerInstanceID string
}

// WorkerSweepResult says what SweepWorkers did to one registration.
type WorkerSweepResult struct {
	// Swept: under its row lock the registration was still stale and is
	// deleted. False: a heartbeat (or mark_worker_dead) got there first.
	Swept bool
	// EventWritten: its ttl_swept event was written. False with Swept: an
	// event of the same instance, kind and millisecond exists already
	// (FlowFabric's ON CONFLICT DO NOTHING), so none was added.
	EventWritten bool
	// DeadlineMs is when the registration lapsed by the row deleted
	// (last_heartbeat_ms + liveness_ttl_ms), when Swept: the deadline its
	// lateness is measured from.
	DeadlineMs int64
}

// sweepWorkersSQL is FlowFabric's ttl_sweep_tick for a batch of
// registrations of one partition ($2 namespaces and $3 instance ids, in
// order; $4 now): each is deleted only if, under its row lock, it is still
// stale (DELETE re-evaluates its condition on the newest committed
// version, so a heartbeat committed meanwhile keeps it), and every deleted
// row gets a ttl_swept event with its partition, namespace and instance id,
// unless the event's key is taken. Index: the registry's primary key.
var sweepWorkersSQL = `
WITH input AS (
    SELECT i.namespace, i.worker_instance_id, i.ord
      FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS i(namespace, worker_instance_id, ord)
), swept AS (
    DELETE FROM ff_worker_registry w
     USING input i
     WHERE w.partition_key = $1 AND w.namespace = i.namespace AND w.worker_instance_id = i.worker_instance_id
       AND w.last_heartbeat_ms::numeric + w.liveness_ttl_ms < $4
    RETURNING w.partition_key, w.namespace, w.worker_instance_id,
              ` + lapsedAtSQL("w") + ` AS lapsed_at_ms
), ev AS (
    INSERT INTO ff_worker_registry_event (partition_key, namespace, worker_instance_id, event_kind, event_at_ms, reason)
    SELECT partition_key, namespace, worker_instance_id, 'ttl_swept', $4, NULL FROM swept
    ON CONFLICT DO NOTHING
    RETURNING namespace, worker_instance_id
)
SELECT swept.worker_instance_id IS NOT NULL, ev.worker_instance_id IS NOT NULL, COALESCE(swept.lapsed_at_ms, 0)
  FROM input i
  LEFT JOIN swept ON swept.namespace = i.namespace AND swept.worker_instance_id = i.worker_instance_id
  LEFT JOIN ev ON ev.namespace = i.namespace AND ev.worker_instance_id = i.worker_instance_id
 ORDER BY i.ord`

// SweepWorkers deletes registrations of one registry partition whose TTL
// lapsed, as FlowFabric's TTL sweep does, with one result per ref in order.
// Each is re-checked under its own row lock; a second call changes nothing.
func SweepWorkers(ctx context.Context, db DB, partition int16, refs []WorkerRef, nowMs int64) ([]WorkerSweepResult, error) {
	ns := make([]string, len(refs))
	ids := make([]string, len(refs))
	keys := make([]string, len(refs))
	for i, r := range refs {
		ns[i], ids[i], keys[i] = r.Namespace, r.WorkerInstanceID, r.Namespace+"/"+r.WorkerInstanceID
	}
	var r WorkerSweepResult
	return batch[WorkerSweepResult]{
		sql:  sweepWorkersSQL,
		args: func(round []int) []any { return []any{partition, pick(ns, round), pick(ids, round), nowMs} },
		dest: []any{&r.Swept, &r.EventWritten, &r.DeadlineMs},
		read: func() WorkerSweepResult { return r },
		what: "sweep stale worker", partition: partition,
	}.run(ctx, db, keys)
}
