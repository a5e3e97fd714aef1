package migrations

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/flowfabric/ffreconcile/internal/dbnames"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// ValidateSchemaName reports whether name is usable as River's schema (see
// dbnames.ValidateSchemaName).
func ValidateSchemaName(name string) error { return dbnames.ValidateSchemaName(name) }

// ApplyRiver creates schema (if missing) and runs River's migrations in it.
// It returns the versions applied; none when River is already up to date.
func ApplyRiver(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) ([]int, error) {
	if err := ValidateSchemaName(schema); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("river migrations in schema %s: %w", schema, err)
	}
	versions := make([]int, 0, len(res.Versions))
	for _, v := range res.Versions {
		versions = append(versions, v.Version)
	}
	return versions, nil
}
