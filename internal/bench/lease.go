package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// The SQL in this package's reference designs is the seeds' own, kept here
// (not in store/) because it is a yardstick, not something the worker runs.

var leaseScenario = scenario{
	name:      "lease_expiry",
	configure: withoutAttemptTimeout,
	seed: func(ctx context.Context, e *env, due, notDue int) error {
		now := store.NowMs()
		for _, batch := range []struct {
			n   int
			exp int64
		}{{due, now - 5000}, {notDue, now + 3_600_000}} {
			if batch.n == 0 {
				continue
			}
			execs := make([]ffseed.Exec, batch.n)
			attempts := make([]ffseed.Attempt, batch.n)
			for i := range batch.n {
				execs[i] = ffseed.Exec{Partition: int16((i + 1) % 256), ID: ffseed.NewUUID(), LaneID: "bench", RawFields: benchTenantRaw}
				attempts[i] = ffseed.Attempt{Partition: execs[i].Partition, ExecutionID: execs[i].ID, WorkerID: "bench-worker",
					LeaseEpoch: 1, LeaseExpiresAtMs: ffseed.Ms(batch.exp - rand.Int64N(1001))}
			}
			err := errors.Join(ffseed.InsertMany(ctx, e.pool, execs), ffseed.InsertMany(ctx, e.pool, attempts))
			if err != nil {
				return err
			}
		}
		return nil
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms < $1`, store.NowMs()).Scan(&n)
		return n, err
	},
	// The seed's scan_tick query.
	scan: scanKeys(`
			SELECT execution_id::text, attempt_index FROM ff_attempt
			 WHERE partition_key = $1 AND lease_expires_at_ms IS NOT NULL AND lease_expires_at_ms < $2
			 ORDER BY lease_expires_at_ms ASC LIMIT $3`),
	// The seed's release_one, plus the `expired` lease event FlowFabric
	// writes since 0.10 (namespace and instance tag from the execution).
	seedRow: func(ctx context.Context, tx pgx.Tx, p int16, k rowKey, now int64) error {
		var exp *int64
		err := tx.QueryRow(ctx, `SELECT lease_expires_at_ms FROM ff_attempt
			WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3 FOR UPDATE`, p, k.id, k.n).Scan(&exp)
		if err == pgx.ErrNoRows || exp == nil || *exp >= now {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE ff_attempt SET lease_expires_at_ms = NULL, outcome = 'lease_expired_reclaimable'
			WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`, p, k.id, k.n); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', ownership_state = 'unowned',
			eligibility_state = 'eligible_now', attempt_state = 'attempt_interrupted',
			raw_fields = raw_fields || jsonb_build_object('lease_expired_at_ms', $3::bigint)
			WHERE partition_key = $1 AND execution_id = $2 AND lifecycle_phase = 'active'`, p, k.id, now); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
			SELECT $2::text, NULL, 'expired', $3, $1::int,
			       (SELECT raw_fields->>'namespace' FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2::uuid),
			       (SELECT raw_fields->'tags'->>'cairn.instance_id' FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2::uuid)`,
			p, k.id, now)
		return err
	},
	setBased: func(ctx context.Context, db store.DB, p int16, now int64) error {
		_, err := db.Exec(ctx, `
			WITH att AS (
			    UPDATE ff_attempt SET lease_expires_at_ms = NULL, outcome = 'lease_expired_reclaimable'
			     WHERE partition_key = $1 AND lease_expires_at_ms IS NOT NULL AND lease_expires_at_ms < $2
			    RETURNING execution_id
			), ec AS (
			    UPDATE ff_exec_core e SET lifecycle_phase = 'runnable', ownership_state = 'unowned',
			           eligibility_state = 'eligible_now', attempt_state = 'attempt_interrupted',
			           raw_fields = e.raw_fields || jsonb_build_object('lease_expired_at_ms', $2::bigint)
			      FROM att WHERE e.partition_key = $1 AND e.execution_id = att.execution_id AND e.lifecycle_phase = 'active'
			)
			INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
			SELECT att.execution_id::text, 'expired', $2, $1::int, e.raw_fields->>'namespace', e.raw_fields->'tags'->>'cairn.instance_id'
			  FROM att LEFT JOIN ff_exec_core e ON e.partition_key = $1 AND e.execution_id = att.execution_id`, p, now)
		if err != nil {
			return fmt.Errorf("set-based release in partition %d: %w", p, err)
		}
		return nil
	},
}

// scanKeys returns a seed-style scan: sql selects (id, n) for partition $1
// due at $2, limited to $3 rows.
func scanKeys(sql string) func(context.Context, store.DB, int16, int64) ([]rowKey, error) {
	return func(ctx context.Context, db store.DB, p int16, now int64) ([]rowKey, error) {
		rows, err := db.Query(ctx, sql, p, now, seedBatch)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (rowKey, error) {
			var k rowKey
			err := r.Scan(&k.id, &k.n)
			return k, err
		})
	}
}
