package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/workers"
)

// catalogSQL describes every table of $1 as lines of text, one fact per
// line, so two schemas compare line by line: each column (in order, with its
// type, nullability and default), the partitioning and the number and names
// of the hash children, the primary key, every index of the parent, the
// triggers and their functions' bodies (whitespace folded); indexes of our
// own (ffreconcile_*, see migrations.ApplyRetentionIndex) are left out. Index definitions name the table (ON ONLY t, not the child), so
// they compare across databases.
const catalogSQL = `
SELECT t || ' column ' || lpad(a.attnum::text, 2, '0') || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
       || COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
       || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
  FROM unnest($1::text[]) t
  JOIN pg_attribute a ON a.attrelid = t::regclass AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
UNION ALL
SELECT t || ' partitioned ' || pg_get_partkeydef(t::regclass) || ', '
       || (SELECT count(*) FROM pg_inherits WHERE inhparent = t::regclass) || ' children'
  FROM unnest($1::text[]) t WHERE (SELECT relkind FROM pg_class WHERE oid = t::regclass) = 'p'
UNION ALL
SELECT t || ' child ' || c.relname || ' ' || pg_get_expr(c.relpartbound, c.oid)
  FROM unnest($1::text[]) t JOIN pg_inherits i ON i.inhparent = t::regclass JOIN pg_class c ON c.oid = i.inhrelid
UNION ALL
SELECT t || ' constraint ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
  FROM unnest($1::text[]) t JOIN pg_constraint con ON con.conrelid = t::regclass
UNION ALL
SELECT t || ' index ' || regexp_replace(pg_get_indexdef(ix.indexrelid), ' ON (ONLY )?public\.', ' ON ')
  FROM unnest($1::text[]) t JOIN pg_index ix ON ix.indrelid = t::regclass
 WHERE ix.indexrelid::regclass::text NOT LIKE 'ffreconcile\_%'
UNION ALL
SELECT t || ' trigger ' || tg.tgname || ' ' || regexp_replace(pg_get_triggerdef(tg.oid), ' ON public\.', ' ON ')
  FROM unnest($1::text[]) t JOIN pg_trigger tg ON tg.tgrelid = t::regclass AND NOT tg.tgisinternal
UNION ALL
SELECT t || ' trigger function ' || pr.proname || ': ' || regexp_replace(btrim(pr.prosrc), '\s+', ' ', 'g')
  FROM unnest($1::text[]) t JOIN pg_trigger tg ON tg.tgrelid = t::regclass AND NOT tg.tgisinternal
  JOIN pg_proc pr ON pr.oid = tg.tgfoid
ORDER BY 1`

func catalog(t *testing.T, pool *pgxpool.Pool, tables []string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), catalogSQL, tables)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestSchemaMatchesFlowFabricMigrations compares a database migrated by
// FlowFabric's own migrations (../shared/flowfabric/migrations, in name
// order) with one migrated by migrations.ApplyFF, as `worker migrate
// --ff-schema` migrates it: both are clones of testdb's templates, built by
// those two from empty databases, so no test pays for the 256-partition DDL
// again. It compares every table ApplyFF creates: columns (name, order, type, nullability, default),
// partitioning (key, children and their names and bounds), constraints,
// indexes and triggers must be the same, so the worker runs unchanged on a
// database FlowFabric migrated, and a database this project created is one
// FlowFabric would accept. It also checks that every index a reconciler's
// queries rely on (its store.Due's Index) exists in FlowFabric's schema. A
// regression prints every differing line, FlowFabric's side first. Skipped,
// saying why, when FlowFabric's migrations are not beside the clone.
func TestSchemaMatchesFlowFabricMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ff := testdb.NewFlowFabric(t)
	ours := testdb.New(t)
	tables := migrations.FFTableNames()
	want, got := catalog(t, ff.Pool, tables), catalog(t, ours.Pool, tables)
	var diff []string
	for _, l := range want {
		if !slices.Contains(got, l) {
			diff = append(diff, "  FlowFabric: "+l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			diff = append(diff, "  --ff-schema: "+l)
		}
	}
	if len(diff) > 0 {
		t.Errorf("%d catalog lines differ between FlowFabric's migrations and --ff-schema:\n%s", len(diff), strings.Join(diff, "\n"))
	}
	if len(want) < 20*len(tables) {
		t.Errorf("only %d catalog lines for %d tables: the comparison read too little", len(want), len(tables))
	}

	for _, r := range workers.All() {
		if !r.HasDue() {
			continue
		}
		var ok bool
		if err := ff.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, r.Due.Index).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("%s: its scans rely on index %s, which FlowFabric's migrations do not create", r.Name, r.Due.Index)
		}
	}
	if err := migrations.Check(ctx, ff.Pool, testdb.RiverSchema); err != nil {
		t.Errorf("Check on FlowFabric's schema: %v", err)
	}
	t.Log(fmt.Sprintf("%d catalog lines compared over %d tables", len(want), len(tables)))
}
