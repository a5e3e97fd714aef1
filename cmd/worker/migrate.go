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
	f := newFlagSet("migrate", "Create River's tables in their own schema, what the reconcilers need of ours (the function ffreconcile_promote\nthere for ad-hoc promotions in one SQL call, replaced in place by a newer version; tables of ours; partial indexes\non FlowFabric's tables, built online on a large table) and, with --ff-schema, the FlowFabric-compatible ff_* tables\n(256 hash partitions each). Running it again is a no-op. Existing ff_* tables are never altered but for those indexes.")
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
	// The reconcilers' objects (migrations.Object): indexes on FlowFabric's
	// tables once they exist (a database FlowFabric has not migrated yet
	// gets them at the next run), tables of ours, the promote function
	// other services call to enqueue a promotion in their own transaction.
	report, err := migrations.ApplyObjects(ctx, pool, schema)
	for _, line := range report {
		fmt.Fprintln(stdout, line)
	}
	if err != nil {
		return dbconn.Scrub(err, dsn)
	}
	return nil
}
