package ffread

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Lease event types (lease_event.rs:20-24).
const (
	leaseEventAcquired = "acquired"
	leaseEventRevoked  = "revoked"
)

// emitLeaseEvent is lease_event::emit (lease_event.rs:26-79): one
// ff_lease_event row inside tx, with namespace and instance tag (the value
// of the execution's cairn.instance_id tag) copied from the execution row,
// or NULL when the row is missing. The casts are the types sqlx declares
// for the bound values (String, Option<&str>, &str, i64, i32, Uuid): left
// to the server's inference, the UNION resolves its untyped parameters as
// text, which cannot go into the bigint and integer columns.
func emitLeaseEvent(ctx context.Context, tx pgx.Tx, k execKey, leaseID *string, eventType string, occurredAtMs int64) error {
	_, err := tx.Exec(ctx, "INSERT INTO ff_lease_event "+
		"(execution_id, lease_id, event_type, occurred_at_ms, partition_key, "+
		"namespace, instance_tag) "+
		"SELECT $1::text, $2::text, $3::text, $4::bigint, $5::int4, "+
		"raw_fields->>'namespace', "+
		"raw_fields->'tags'->>'cairn.instance_id' "+
		"FROM ff_exec_core "+
		"WHERE partition_key = $5 AND execution_id = $6::uuid "+
		"UNION ALL "+
		"SELECT $1, $2, $3, $4, $5, NULL, NULL "+
		"WHERE NOT EXISTS ( "+
		"SELECT 1 FROM ff_exec_core "+
		"WHERE partition_key = $5 AND execution_id = $6::uuid "+
		")",
		k.id, leaseID, eventType, occurredAtMs, int32(k.part), k.id)
	if err != nil {
		return dbErr("emit "+eventType+" lease event", k, err)
	}
	return nil
}
