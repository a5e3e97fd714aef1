package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
)

func migrateCommand(ctx context.Context, args []string, stdout, _ io.Writer, logger *slog.Logger) error {
	var dsn, schema string
	var ffSchema, createDB bool
	f := newFlagSet("migrate", "Create River's tables in their own schema, the function ffreconcile_promote there (ad-hoc promotions in one SQL\ncall, replaced in place by a newer version) and, with --ff-schema, the FlowFabric-compatible\nff_* tables (256 hash partitions each). Running it again is a no-op. Existing ff_* tables are never altered,\nexcept that ff_exec_core gets retention's partial index of terminal executions (built online on a large table).")
	databaseURLFlag(f, &dsn)
	f.String(&schema, "river-schema", "FF_RIVER_SCHEMA", jobs.DefaultRiverSchema, "Postgres schema holding River's tables")
	f.Bool(&ffSchema, "ff-schema", "FF_MIGRATE_FF_SCHEMA", false, "also create missing ff_* tables (for development, tests and new installs)")
	f.Bool(&createDB, "create-database", "FF_MIGRATE_CREATE_DATABASE", false, "create the database when the server says it does not exist (`make run` uses this for its own database)")
	if err := f.parse(args, stdout); err != nil {
		return err
	}
	if err := migrations.ValidateSchemaName(schema); err != nil {
		return usageError{err}
	}
	if dsn == "" {
		dsn = dbconn.DefaultURL
	}
	if createDB {
		created, err := dbconn.CreateIfMissing(ctx, dsn)
		if err != nil {
			return err
		}
		if created {
			fmt.Fprintf(stdout, "created database %s\n", dbconn.Redact(dsn))
		}
	}
	pool, err := dbconn.Open(ctx, dsn, dbconn.Options{MaxConns: 2, AppName: "ffreconcile-migrate"})
	if err != nil {
		return err
	}
	defer pool.Close()

	versions, err := migrations.ApplyRiver(ctx, pool, schema, logger)
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	if len(versions) == 0 {
		fmt.Fprintf(stdout, "river: schema %s already up to date\n", schema)
	} else {
		fmt.Fprintf(stdout, "river: applied migrations %v in schema %s\n", versions, schema)
	}
	// The worker heartbeat table lives beside River's tables (see
	// migrations.ApplyWorkerTable); `worker status` reads it.
	if err := migrations.ApplyWorkerTable(ctx, pool, schema); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	// So is the promote function other services call to enqueue a
	// promotion in their own transaction (see migrations.PromoteFunctionSQL).
	pf, err := migrations.ApplyPromoteFunction(ctx, pool, schema)
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	fmt.Fprintln(stdout, promoteFunctionReport(schema, pf))
	// So is the record of how far outbox retention has trimmed, next to
	// the outboxes (see migrations.ApplyOutboxTrimTable).
	if err := migrations.ApplyOutboxTrimTable(ctx, pool); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	if ffSchema {
		res, err := migrations.ApplyFF(ctx, pool)
		if err != nil {
			return dbconn.Scrub(err, dsn)
		}
		if len(res.Created) > 0 {
			fmt.Fprintf(stdout, "ff schema: created %s\n", strings.Join(res.Created, ", "))
		}
		if len(res.Existed) > 0 {
			fmt.Fprintf(stdout, "ff schema: left existing tables untouched: %s\n", strings.Join(res.Existed, ", "))
		}
	}
	// Retention's index, on FlowFabric's table when it exists (a database
	// FlowFabric has not migrated yet gets it at the next run).
	var execCore bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('ff_exec_core') IS NOT NULL`).Scan(&execCore); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	if !execCore {
		fmt.Fprintf(stdout, "retention index: skipped, ff_exec_core does not exist yet\n")
		return nil
	}
	if err := migrations.ApplyRetentionIndex(ctx, pool); err != nil {
		return dbconn.Scrub(err, dsn)
	}
	fmt.Fprintf(stdout, "retention index: %s on ff_exec_core is in place\n", migrations.RetentionIndexName)
	return nil
}

// promoteFunctionReport is migrate's line about the promote function.
func promoteFunctionReport(schema string, r migrations.PromoteFunctionResult) string {
	name := schema + "." + migrations.PromoteFunctionName
	switch {
	case r.Installed > migrations.PromoteFunctionVersion:
		return fmt.Sprintf("promote function: %s version %d is newer than this worker's %d; left in place", name, r.Installed, migrations.PromoteFunctionVersion)
	case !r.Found:
		return fmt.Sprintf("promote function: installed %s version %d", name, r.Installed)
	case r.Previous < r.Installed:
		return fmt.Sprintf("promote function: replaced %s version %d with version %d", name, r.Previous, r.Installed)
	}
	return fmt.Sprintf("promote function: %s version %d is in place", name, r.Installed)
}
