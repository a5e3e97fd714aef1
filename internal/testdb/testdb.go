// Package testdb gives each test its own real PostgreSQL database, migrated
// with River's tables and the 256-partition ff_* schema.
//
// Creating 7 tables × 256 partitions takes seconds, so the schema is built
// once into a template database (named after the DDL's fingerprint, so a DDL
// change rebuilds it) and each test clones it with CREATE DATABASE … TEMPLATE,
// which takes a fraction of that. Databases are dropped when the test ends.
//
// The server is TEST_DATABASE_URL, else DATABASE_URL, else
// dbconn.DefaultURL (the local server, without TLS).
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
)

// RiverSchema is the schema River's tables live in inside test databases.
const RiverSchema = jobs.DefaultRiverSchema

// AdminURL is the URL of the server's maintenance database used to create
// and drop test databases.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return dbconn.DefaultURL
}

// WithDatabase returns base with its database name replaced by name.
func WithDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		// Key/value DSN: a later dbname overrides an earlier one.
		return base + " dbname=" + name, nil
	}
	u.Path = "/" + name
	return u.String(), nil
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// DB is one test database.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// New creates a fresh database for t, migrated with River (schema
// RiverSchema) and the ff_* tables, and drops it when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(ctx) })
	if templateErr != nil {
		t.Fatalf("testdb: build template database: %v", templateErr)
	}

	// The template has no open connections (ensureTemplate closes its own), so
	// many tests may clone it at once.
	return create(t, ctx, " TEMPLATE "+pgx.Identifier{templateName}.Sanitize())
}

// NewEmpty creates a database with nothing in it (no River, no ff tables)
// and drops it when t ends.
func NewEmpty(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return create(t, ctx, "")
}

// create makes a database named ffr_t_<random> (with the given CREATE
// DATABASE options), opens a pool on it and drops it when t ends.
func create(t testing.TB, ctx context.Context, options string) *DB {
	t.Helper()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("testdb: connect to %s: %v", redactedAdmin(), err)
	}
	defer admin.Close(ctx)
	name := "ffr_t_" + randomSuffix()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+options); err != nil {
		t.Fatalf("testdb: create database %s: %v", name, err)
	}
	dbURL, err := WithDatabase(AdminURL(), name)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("testdb: open pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		dropDatabase(name)
	})
	return &DB{Name: name, URL: dbURL, Pool: pool}
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// ensureTemplate builds the template database once per server and DDL
// version. Test binaries of several packages run in parallel, so the build
// is serialised with an advisory lock and published by a rename only when
// complete.
func ensureTemplate(ctx context.Context) (string, error) {
	name := "ffr_tmpl_" + migrations.Fingerprint()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", redactedAdmin(), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(hashtext('ffreconcile.testdb.template'))`); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext('ffreconcile.testdb.template'))`) //nolint:errcheck

	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}

	// Templates of older DDL versions and half-built ones are of no further use.
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'ffr\_tmpl\_%'`)
	if err != nil {
		return "", err
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	for _, s := range stale {
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", err
		}
	}

	building := name + "_building"
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
		return "", err
	}
	buildURL, err := WithDatabase(AdminURL(), building)
	if err != nil {
		return "", err
	}
	if err := migrateInto(ctx, buildURL); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s",
		pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	return name, nil
}

func migrateInto(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.ApplyRiver(ctx, pool, RiverSchema, nil); err != nil {
		return err
	}
	if _, err := migrations.ApplyFF(ctx, pool); err != nil {
		return err
	}
	return migrations.ApplyWorkerTable(ctx, pool, RiverSchema)
}

// PoolAsNewRole creates a login role with no rights beyond PUBLIC's, except
// CREATE on d's schema public (PostgreSQL 15 gives PUBLIC none there), and
// returns a pool on d as that role. Pool, what the role owns in d and the
// role itself go when t ends.
func (d *DB) PoolAsNewRole(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	name := "ffr_t_role_" + randomSuffix()
	role := pgx.Identifier{name}.Sanitize()
	if _, err := d.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatalf("testdb: create role: %v", err)
	}
	if _, err := d.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO `+role); err != nil {
		t.Fatalf("testdb: grant create on schema public: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: open pool as %s: %v", role, err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx := context.Background()
		if _, err := d.Pool.Exec(ctx, `DROP OWNED BY `+role); err != nil {
			t.Errorf("testdb: drop what %s owns: %v", role, err)
		}
		if _, err := d.Pool.Exec(ctx, `DROP ROLE `+role); err != nil {
			t.Errorf("testdb: drop role %s: %v", role, err)
		}
	})
	return pool
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redactedAdmin() string {
	u, err := url.Parse(AdminURL())
	if err != nil || u.User == nil {
		return "the test database server"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// InsertRawJob inserts a job into River's river_job with plain SQL, as a
// non-Go River client or a hand-written query would (no insert hooks, no
// unique key), due a second ago, and returns its id. A finalized state gets
// finalized_at, which River's check constraint requires.
func (d *DB) InsertRawJob(t testing.TB, kind, queue, state, args string) int64 {
	t.Helper()
	var id int64
	err := d.Pool.QueryRow(context.Background(), `
		INSERT INTO `+pgx.Identifier{RiverSchema, "river_job"}.Sanitize()+`
		       (args, kind, max_attempts, queue, state, scheduled_at, finalized_at)
		VALUES ($1::jsonb, $2, 5, $3, $4::text::`+pgx.Identifier{RiverSchema, "river_job_state"}.Sanitize()+`,
		        now() - interval '1 second', CASE WHEN $4 IN ('completed', 'cancelled', 'discarded') THEN now() END)
		RETURNING id`, args, kind, queue, state).Scan(&id)
	if err != nil {
		t.Fatalf("insert %s job (%s, %s, %s): %v", kind, queue, state, args, err)
	}
	return id
}
