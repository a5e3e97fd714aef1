package store

import "context"

// ExpiredBudgetDedupKeys are report_usage idempotency keys whose
// expires_at_ms has passed: FlowFabric's migration 0002 bounds their
// retention with it and leaves their eviction to "a future TTL sweeper"
// that its Postgres backend never got (Valkey expires the keys after
// 24 h by their TTL). A key at exactly its expiry is kept until the next
// millisecond. Dedup keys belong to no tenant. Index:
// ff_budget_usage_dedup_expires_idx (partition_key, expires_at_ms),
// FlowFabric's own (0002): a probe reads one entry per budget partition and
// a scan O(due rows of the partition).
var ExpiredBudgetDedupKeys = &Due{
	What:  "expired budget usage dedup keys",
	From:  "ff_budget_usage_dedup r",
	At:    "r.expires_at_ms",
	ID:    Key{"r.dedup_key", "text"},
	Index: "ff_budget_usage_dedup_expires_idx",
}

// BudgetDedupExpiryResult says what DeleteExpiredBudgetDedupKeys did to one
// key.
type BudgetDedupExpiryResult struct {
	// Deleted: under its row lock the key still existed with its expiry
	// passed, and it is deleted. False: it was deleted or renewed
	// meanwhile: nothing changed.
	Deleted bool
	// DeadlineMs is the expiry the key had under its lock, when Deleted.
	DeadlineMs int64
}

// deleteBudgetDedupKeysSQL deletes a batch of keys of one budget partition
// ($2 keys, in order; $3 now) whose expiry is still past under their row
// locks: a DELETE locks each row and re-reads its expires_at_ms against the
// newest committed version, so a key a concurrent report_usage wrote again
// (a later expiry) is kept, and a second run finds nothing. Index: the
// primary key (partition_key, dedup_key).
const deleteBudgetDedupKeysSQL = `
WITH input AS (
    SELECT i.dedup_key, i.ord FROM unnest($2::text[]) WITH ORDINALITY AS i(dedup_key, ord)
), del AS (
    DELETE FROM ff_budget_usage_dedup d
     WHERE d.partition_key = $1 AND d.dedup_key IN (SELECT dedup_key FROM input)
       AND d.expires_at_ms < $3
    RETURNING d.dedup_key, d.expires_at_ms
)
SELECT del.dedup_key IS NOT NULL, COALESCE(del.expires_at_ms, 0)
  FROM input i
  LEFT JOIN del ON del.dedup_key = i.dedup_key
 ORDER BY i.ord`

// DeleteExpiredBudgetDedupKeys deletes expired dedup keys of one budget
// partition, with one result per key in order. Each key is re-checked under
// its own row lock; a second call changes nothing.
func DeleteExpiredBudgetDedupKeys(ctx context.Context, db DB, partition int16, keys []string, nowMs int64) ([]BudgetDedupExpiryResult, error) {
	var r BudgetDedupExpiryResult
	return batch[BudgetDedupExpiryResult]{
		sql:  deleteBudgetDedupKeysSQL,
		args: func(round []int) []any { return []any{partition, pick(keys, round), nowMs} },
		dest: []any{&r.Deleted, &r.DeadlineMs},
		read: func() BudgetDedupExpiryResult { return r },
		what: "delete expired budget dedup key", partition: partition,
	}.run(ctx, db, keys)
}
