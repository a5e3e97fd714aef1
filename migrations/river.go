package migrations

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// schemaNameRE is the identifier form accepted for the River schema. The name
// is interpolated into DDL (CREATE SCHEMA cannot take a parameter), so it is
// validated first; it matches River's own check for Config.Schema.
var schemaNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,62}$`)

// ValidateSchemaName reports whether name is usable as River's schema.
func ValidateSchemaName(name string) error {
	if !schemaNameRE.MatchString(name) {
		return fmt.Errorf("invalid River schema name %q: use letters, digits and underscores, starting with a letter or underscore (at most 63 characters)", name)
	}
	return nil
}

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
