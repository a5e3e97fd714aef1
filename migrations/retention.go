package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RetentionIndexName is our index on ff_exec_core, the one retention's
// ticks and trims read: FlowFabric's migrations index no column of a
// terminal execution's age (its own trim reads a lane's executions whole),
// so without it every retention tick would read every execution.
const RetentionIndexName = "ffreconcile_exec_core_terminal_idx"

// retentionIndexCols is the index's definition after ON <table>.
const retentionIndexCols = `(partition_key, terminal_at_ms) WHERE lifecycle_phase = 'terminal'`

// onlineIndexRows is the estimated size of ff_exec_core above which the
// index is built one partition at a time with CREATE INDEX CONCURRENTLY,
// so writers are never blocked; below it one CREATE INDEX blocks writes for
// well under a second.
const onlineIndexRows = 100_000

// ApplyRetentionIndex creates the retention index on ff_exec_core if it is
// missing (or was left unfinished); running it again is a no-op. It is ours,
// not FlowFabric's, and a partial index of terminal executions only, so it
// costs nothing to writes of live executions; `worker migrate` applies it
// with or without --ff-schema, after ff_exec_core exists.
//
// On a large table it is built online: the parent's index is created ON
// ONLY (invalid until every partition has its own), then each partition's
// index CONCURRENTLY and attached. An interrupted build is resumed where it
// stopped: invalid partition indexes are dropped and rebuilt.
func ApplyRetentionIndex(ctx context.Context, pool *pgxpool.Pool) error {
	return applyRetentionIndex(ctx, pool, onlineIndexRows)
}

func applyRetentionIndex(ctx context.Context, pool *pgxpool.Pool, onlineRows float64) error {
	fail := func(err error) error { return fmt.Errorf("retention index %s: %w", RetentionIndexName, err) }
	var (
		exists, valid bool
		rows          float64
	)
	err := pool.QueryRow(ctx, `
SELECT to_regclass($1) IS NOT NULL,
       COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false),
       COALESCE((SELECT sum(GREATEST(c.reltuples, 0)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                  WHERE i.inhparent = 'ff_exec_core'::regclass), 0)`, RetentionIndexName).Scan(&exists, &valid, &rows)
	if err != nil {
		return fail(err)
	}
	if exists && valid {
		return nil
	}
	if !exists && rows < onlineRows {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// See ApplyWorkerTable: CREATE … IF NOT EXISTS races itself.
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.retention_index'))`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+RetentionIndexName+` ON ff_exec_core `+retentionIndexCols)
			return err
		})
		if err != nil {
			return fail(err)
		}
		return nil
	}
	// Online: one partition at a time, none in a transaction block.
	if _, err := pool.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+RetentionIndexName+` ON ONLY ff_exec_core `+retentionIndexCols); err != nil {
		return fail(err)
	}
	rs, err := pool.Query(ctx, `
SELECT c.relname,
       (SELECT ci.relname FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid
         WHERE ci.relname = c.relname || '_ffr_terminal_idx'),
       COALESCE((SELECT x.indisvalid FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid
         WHERE ci.relname = c.relname || '_ffr_terminal_idx'), false),
       EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_class ci ON ci.oid = ii.inhrelid
         WHERE ii.inhparent = to_regclass($1) AND ci.relname = c.relname || '_ffr_terminal_idx')
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'ff_exec_core'::regclass
 ORDER BY c.relname`, RetentionIndexName)
	if err != nil {
		return fail(err)
	}
	type child struct {
		table           string
		index           *string
		valid, attached bool
	}
	children, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (child, error) {
		var c child
		return c, r.Scan(&c.table, &c.index, &c.valid, &c.attached)
	})
	if err != nil {
		return fail(err)
	}
	for _, c := range children {
		idx := c.table + "_ffr_terminal_idx"
		if c.index != nil && !c.valid {
			if _, err := pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{idx}.Sanitize()); err != nil {
				return fail(fmt.Errorf("drop unfinished %s: %w", idx, err))
			}
		}
		if c.index == nil || !c.valid {
			if _, err := pool.Exec(ctx, `CREATE INDEX CONCURRENTLY IF NOT EXISTS `+pgx.Identifier{idx}.Sanitize()+
				` ON `+pgx.Identifier{c.table}.Sanitize()+` `+retentionIndexCols); err != nil {
				return fail(fmt.Errorf("build %s: %w", idx, err))
			}
		}
		if !c.attached {
			if _, err := pool.Exec(ctx, `ALTER INDEX `+RetentionIndexName+` ATTACH PARTITION `+pgx.Identifier{idx}.Sanitize()); err != nil {
				return fail(fmt.Errorf("attach %s: %w", idx, err))
			}
		}
	}
	return nil
}
