package store

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Leaves names, for each partition key, the leaf partition holding its rows
// in each of some of FlowFabric's hash-partitioned tables. A statement
// written against the leaves can keep a generic plan per partition
// (cached with the prepared statement, planned once per connection), where
// the same statement over a 256-way parent needs a custom plan at every
// run: a generic plan over a parent locks all 256 children on Postgres 15.
// The dependency reconciler's single events use it: planning was a third
// of their dispatch (docs/performance.md, "The single event's transaction:
// dispatch lanes").
type Leaves struct {
	// byTable maps a parent table to its leaves by partition key.
	byTable map[string]*[256]string
	// ref matches a reference to one of the tables in a statement of ours
	// (\b: ff_edge is not a prefix of ff_edge_group), with the INSERT INTO
	// before it when it is an insert's target.
	ref *regexp.Regexp
	// rewritten caches each statement's text per partition key.
	rewritten sync.Map // leafKey → string
}

type leafKey struct {
	sql       string
	partition int16
}

// LoadLeaves reads from the catalog which leaf of each of tables holds
// each partition key (0-255): Postgres's own hash partitioning decides it
// (satisfies_hash_partition), whatever the leaves are named. About 0.15 s
// for five tables, once per process. A table that is not hash-partitioned
// with a leaf for every key is an error: the caller keeps the parents'
// statements.
func LoadLeaves(ctx context.Context, db DB, tables ...string) (*Leaves, error) {
	rows, err := db.Query(ctx, `
SELECT i.inhparent::regclass::text, k, i.inhrelid::regclass::text
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), 'modulus (\d+), remainder (\d+)') m
 CROSS JOIN generate_series(0, 255) k
 WHERE i.inhparent = ANY($1::regclass[])
   AND satisfies_hash_partition(i.inhparent, m[1]::int, m[2]::int, k::int2)`, tables)
	if err != nil {
		return nil, fmt.Errorf("read leaf partitions: %w", err)
	}
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = regexp.QuoteMeta(t)
	}
	l := &Leaves{byTable: map[string]*[256]string{},
		ref: regexp.MustCompile(`(INSERT INTO )?\b(` + strings.Join(quoted, "|") + `)\b`)}
	var (
		parent, leaf string
		k            int
	)
	_, err = pgx.ForEachRow(rows, []any{&parent, &k, &leaf}, func() error {
		t := l.byTable[parent]
		if t == nil {
			t = new([256]string)
			l.byTable[parent] = t
		}
		t[k] = leaf
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read leaf partitions: %w", err)
	}
	for _, name := range tables {
		t := l.byTable[name]
		if t == nil {
			return nil, fmt.Errorf("read leaf partitions: %s has no hash partitions", name)
		}
		for k, leaf := range t {
			if leaf == "" {
				return nil, fmt.Errorf("read leaf partitions: no partition of %s holds partition key %d", name, k)
			}
		}
	}
	return l, nil
}

// Of returns the leaf of table holding partition's rows.
func (l *Leaves) Of(table string, partition int16) string { return l.byTable[table][partition] }

// sql returns statement with each dispatch table it reads or updates named
// by its leaf of partition (an insert's target stays the parent); statement itself when l is nil or partition is out of range.
func (l *Leaves) sql(statement string, partition int16) string {
	if l == nil || partition < 0 || partition > 255 {
		return statement
	}
	k := leafKey{statement, partition}
	if s, ok := l.rewritten.Load(k); ok {
		return s.(string)
	}
	s := l.ref.ReplaceAllStringFunc(statement, func(ref string) string {
		// An insert keeps its parent: a leaf has no identity column
		// (ff_completion_event.event_id is the parent's), and an insert's
		// plan locks its target alone, routing each row at run time.
		if strings.HasPrefix(ref, "INSERT INTO ") {
			return ref
		}
		return l.Of(ref, partition)
	})
	l.rewritten.Store(k, s)
	return s
}
