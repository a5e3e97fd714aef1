package migrations

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Object is a database object of ours that a reconciler needs: an index on
// a FlowFabric table, a table of its own, a function in River's schema.
// Each is declared in the migrations file of the reconciler that needs it
// (migrations/<name>.go), which registers it; that reconciler names it in
// its Tables. `worker migrate` applies every object (ApplyObjects), and a
// fleet checks those of the reconcilers it runs (Check).
type Object struct {
	// Name is its name, as a reconciler's Tables list it.
	Name string
	// On is the FlowFabric table it is built on ("" for one standing
	// alone): `worker migrate` builds it once that table exists.
	On string
	// DDL is its definition, part of Fingerprint.
	DDL string
	// Apply creates or completes it (a no-op when it is in place) and
	// says what it did in one line; schema is River's.
	Apply func(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error)
	// Check reports it missing or unusable, saying what to run.
	Check func(ctx context.Context, pool *pgxpool.Pool, schema string) error
}

// objects are the registered objects, by name.
var objects = map[string]Object{}

// register adds o; each reconciler's migrations file registers its objects.
func register(o Object) {
	if _, dup := objects[o.Name]; dup {
		panic("migrations: object " + o.Name + " registered twice")
	}
	objects[o.Name] = o
}

// Objects returns the names of every object of ours, sorted.
func Objects() []string {
	out := make([]string, 0, len(objects))
	for name := range objects {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// IsObject reports whether name is an object of ours (not a FlowFabric
// table).
func IsObject(name string) bool {
	_, ok := objects[name]
	return ok
}

// ApplyObjects applies every object of ours, in name order, with River's
// tables in schema, and returns a line for each saying what it did. An
// object built on a FlowFabric table that does not exist yet is skipped,
// saying so (it is built at the next run, once FlowFabric migrated).
func ApplyObjects(ctx context.Context, pool *pgxpool.Pool, schema string) ([]string, error) {
	var report []string
	for _, name := range Objects() {
		o := objects[name]
		if o.On != "" {
			var exists bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, o.On).Scan(&exists); err != nil {
				return report, fmt.Errorf("%s: look up %s: %w", name, o.On, err)
			}
			if !exists {
				report = append(report, fmt.Sprintf("%s: skipped, %s does not exist yet", name, o.On))
				continue
			}
		}
		line, err := o.Apply(ctx, pool, schema)
		if err != nil {
			return report, err
		}
		report = append(report, line)
	}
	return report, nil
}

// checkObjects checks the objects among names, joining every problem into
// one error.
func checkObjects(ctx context.Context, pool *pgxpool.Pool, schema string, names []string) error {
	var problems []string
	for _, name := range names {
		if o, ok := objects[name]; ok {
			if err := o.Check(ctx, pool, schema); err != nil {
				problems = append(problems, err.Error())
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(problems, "; "))
}

// objectsDDL is the definition of every object, for Fingerprint.
func objectsDDL() string {
	var b strings.Builder
	for _, name := range Objects() {
		b.WriteString(objects[name].DDL)
		b.WriteByte(0)
	}
	return b.String()
}
