package migrations

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ApplyRetentionIndexOnline builds the retention index as on a large table:
// one partition at a time, concurrently.
var ApplyRetentionIndexOnline = func(ctx context.Context, pool *pgxpool.Pool) error {
	return applyRetentionIndex(ctx, pool, 0)
}

// CheckRetentionIndex is the check a fleet running retention makes.
var CheckRetentionIndex = func(ctx context.Context, pool *pgxpool.Pool) error { return retentionIndex.check(ctx, pool) }
