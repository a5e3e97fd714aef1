// Package ffseed writes ff_* rows the way FlowFabric writes them, for the
// tests (through package fftest), the benchmarks, the demo and the chaos
// tests. It needs no *testing.T: every function returns its error, wrapped
// with the table's name, and none panics.
//
// Each row type (Exec, Attempt, Suspension, ...) is one row of one ff_*
// table. Its zero fields follow one rule, applied in one place (the type's
// Defaults method): a column FlowFabric always fills (NOT NULL, no column
// default) takes a FlowFabric-like value, said in the field's comment; a
// nullable column stores NULL (a "" string or a nil pointer); a column
// with a column default stores that default. Every function writes every
// column the type has, so a row is the same whichever way it is written.
//
// A row can be written three ways:
//   - Insert: one INSERT, on a *pgxpool.Pool, a pgx.Tx or a *pgx.Conn (DB);
//   - Queue: the same INSERT queued on a *pgx.Batch, sent by the caller;
//   - InsertMany: any number of rows of one type in one statement
//     (INSERT ... SELECT FROM unnest of one array per column), for the
//     benchmarks' hundreds of thousands of rows without a round trip each.
//
// The SQL lives here, beside the fixtures, and not in package store: these
// statements play FlowFabric itself and are never run by the fleet.
package ffseed

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the functions write through: *pgxpool.Pool, pgx.Tx and
// *pgx.Conn satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Row is one row of an ff_* table: one of this package's row types.
type Row interface {
	// Table names the row's table.
	Table() string
	// columns returns the row's columns with its defaults applied.
	columns() ([]column, error)
}

// column is one column of a row: its name, its SQL type, its value (nil:
// NULL; else int64, string, bool, []string or []byte) and, when set, an
// SQL expression the value is put in (%s stands for it).
type column struct {
	name, typ string
	val       any
	expr      string
}

// Insert inserts one row.
func Insert(ctx context.Context, db DB, r Row) error {
	sql, args, err := insertSQL(r)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("ffseed: insert %s: %w", r.Table(), err)
	}
	return nil
}

// Queue queues the INSERT of one row on b; the caller sends the batch, and
// an error of the row's statement is wrapped with its table's name.
func Queue(b *pgx.Batch, r Row) error {
	sql, args, err := insertSQL(r)
	if err != nil {
		return err
	}
	table := r.Table()
	b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("ffseed: insert %s: %w", table, err)
		}
		return nil
	}
	return nil
}

// QueueAll queues the INSERT of each row on b, in order.
func QueueAll[R Row](b *pgx.Batch, rows ...R) error {
	for _, r := range rows {
		if err := Queue(b, r); err != nil {
			return err
		}
	}
	return nil
}

// InsertAll inserts each row with Insert, in order: a few rows of
// different types, say a downstream's edges and its group.
func InsertAll(ctx context.Context, db DB, rows ...Row) error {
	for _, r := range rows {
		if err := Insert(ctx, db, r); err != nil {
			return err
		}
	}
	return nil
}

// InsertMany inserts rows, all of one type, in one statement: INSERT ...
// SELECT FROM unnest with one array parameter per column, so a million rows
// cost one round trip. A column holding the same value in every row is sent
// once, as a scalar. No rows is no statement.
func InsertMany[R Row](ctx context.Context, db DB, rows []R) error {
	if len(rows) == 0 {
		return nil
	}
	table := rows[0].Table()
	cols := make([][]column, len(rows))
	for i, r := range rows {
		c, err := r.columns()
		if err != nil {
			return err
		}
		cols[i] = c
	}
	var names, sel, from []string
	var args []any
	for j, c := range cols[0] {
		names = append(names, c.name)
		var ref string
		if constant(cols, j) && !(j == len(cols[0])-1 && len(from) == 0) {
			args = append(args, c.val)
			ref = "$" + strconv.Itoa(len(args)) + "::" + c.typ
		} else {
			arr, elem, err := columnArray(cols, j)
			if err != nil {
				return fmt.Errorf("ffseed: insert %s: %w", table, err)
			}
			args = append(args, arr)
			from = append(from, "$"+strconv.Itoa(len(args))+"::"+elem+"[]")
			ref = "u.c" + strconv.Itoa(len(from))
			if elem != c.typ {
				ref += "::" + c.typ
			}
		}
		sel = append(sel, wrap(c, ref))
	}
	aliases := make([]string, len(from))
	for i := range from {
		aliases[i] = "c" + strconv.Itoa(i+1)
	}
	sql := "INSERT INTO " + table + " (" + strings.Join(names, ", ") + ") SELECT " + strings.Join(sel, ", ") +
		" FROM unnest(" + strings.Join(from, ", ") + ") AS u(" + strings.Join(aliases, ", ") + ")"
	if _, err := db.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("ffseed: insert %d rows into %s: %w", len(rows), table, err)
	}
	return nil
}

// SeriesChunk is how many rows InsertSeries writes per statement: enough
// that a round trip is nothing beside the rows, few enough that the rows of
// one chunk stay small in memory.
const SeriesChunk = 50_000

// InsertSeries inserts n rows, row(0) to row(n-1), all of one type, with
// InsertMany over SeriesChunk rows at a time: a benchmark's million rows
// without holding them all at once.
func InsertSeries[R Row](ctx context.Context, db DB, n int, row func(i int) R) error {
	rows := make([]R, 0, min(n, SeriesChunk))
	for i := range n {
		rows = append(rows, row(i))
		if len(rows) == SeriesChunk || i == n-1 {
			if err := InsertMany(ctx, db, rows); err != nil {
				return err
			}
			rows = rows[:0]
		}
	}
	return nil
}

// insertSQL returns the one-row INSERT of r and its arguments.
func insertSQL(r Row) (string, []any, error) {
	cols, err := r.columns()
	if err != nil {
		return "", nil, err
	}
	names := make([]string, len(cols))
	vals := make([]string, len(cols))
	args := make([]any, len(cols))
	for i, c := range cols {
		names[i] = c.name
		vals[i] = wrap(c, "$"+strconv.Itoa(i+1)+"::"+c.typ)
		args[i] = c.val
	}
	return "INSERT INTO " + r.Table() + " (" + strings.Join(names, ", ") + ") VALUES (" + strings.Join(vals, ", ") + ")",
		args, nil
}

func wrap(c column, ref string) string {
	if c.expr == "" {
		return ref
	}
	return strings.ReplaceAll(c.expr, "%s", ref)
}

// constant reports whether column j holds one value in every row.
func constant(cols [][]column, j int) bool {
	first := cols[0][j].val
	for _, c := range cols[1:] {
		if !sameValue(first, c[j].val) {
			return false
		}
	}
	return true
}

func sameValue(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case int64:
		b, ok := b.(int64)
		return ok && a == b
	case string:
		b, ok := b.(string)
		return ok && a == b
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case []string:
		b, ok := b.([]string)
		if !ok || len(a) != len(b) || (a == nil) != (b == nil) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	case []byte:
		b, ok := b.([]byte)
		return ok && string(a) == string(b) && (a == nil) == (b == nil)
	}
	return false
}

// columnArray returns column j of every row as one array parameter and the
// SQL type of its elements: integers as bigint, booleans as boolean, bytea
// as bytea, everything else (text, uuid, jsonb, text[]) as text, cast back
// to the column's type in the SELECT.
func columnArray(cols [][]column, j int) (any, string, error) {
	switch cols[0][j].typ {
	case "smallint", "integer", "bigint":
		a := make([]*int64, len(cols))
		for i, c := range cols {
			if v, ok := c[j].val.(int64); ok {
				a[i] = &v
			}
		}
		return a, "bigint", nil
	case "boolean":
		a := make([]*bool, len(cols))
		for i, c := range cols {
			if v, ok := c[j].val.(bool); ok {
				a[i] = &v
			}
		}
		return a, "boolean", nil
	case "bytea":
		a := make([][]byte, len(cols))
		for i, c := range cols {
			a[i], _ = c[j].val.([]byte)
		}
		return a, "bytea", nil
	case "text[]":
		a := make([]*string, len(cols))
		for i, c := range cols {
			if v, ok := c[j].val.([]string); ok {
				s := arrayLiteral(v)
				a[i] = &s
			}
		}
		return a, "text", nil
	default:
		a := make([]*string, len(cols))
		for i, c := range cols {
			switch v := c[j].val.(type) {
			case string:
				a[i] = &v
			case nil:
			default:
				return nil, "", fmt.Errorf("column %s: unexpected %T", c[j].name, v)
			}
		}
		return a, "text", nil
	}
}

// arrayLiteral is a text[] in Postgres's text form.
func arrayLiteral(v []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// NewUUID returns a random (version 4) UUID string.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

// MD5UUID returns md5(s)::uuid, as Postgres computes it: the benchmarks'
// ids are md5('<prefix>' || n), so a row seeded from Go and a statement
// naming it in SQL agree.
func MD5UUID(s string) string { return formatUUID(md5.Sum([]byte(s))) }

func formatUUID(b [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	hex.Encode(s[9:13], b[4:6])
	hex.Encode(s[14:18], b[6:8])
	hex.Encode(s[19:23], b[8:10])
	hex.Encode(s[24:], b[10:16])
	s[8], s[13], s[18], s[23] = '-', '-', '-', '-'
	return string(s[:])
}

// MD5 returns decode(md5(s), 'hex'): 16 bytes, for a grant id.
func MD5(s string) []byte {
	h := md5.Sum([]byte(s))
	return h[:]
}

// WireID is FlowFabric's wire form of an execution id, "{fp:N}:<uuid>":
// what ff_cancel_backlog_member and the quota tables store.
func WireID(partition int16, id string) string {
	return "{fp:" + strconv.Itoa(int(partition)) + "}:" + id
}

// Ms returns a pointer to v, for nullable *_ms fields.
func Ms(v int64) *int64 { return &v }

// Str returns a pointer to s, for nullable text fields that tell NULL from
// "".
func Str(s string) *string { return &s }

// HexID returns a grant id in hex, as a scan of expired grants returns it.
func HexID(id []byte) string { return hex.EncodeToString(id) }

// jsonText returns v as JSON text: a json.RawMessage as it is, anything
// else marshalled (a string is a JSON string); nil returns def.
func jsonText(table, col string, v any, def string) (string, error) {
	switch v := v.(type) {
	case nil:
		return def, nil
	case json.RawMessage:
		return string(v), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("ffseed: %s.%s: %w", table, col, err)
	}
	return string(b), nil
}

// Value helpers: nullable columns.

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullTextPtr(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

func nullMs(v *int64) any {
	if v == nil {
		return nil
	}
	return *v
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orInt(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}

func orStrings(v, def []string) []string {
	if v == nil {
		return def
	}
	return v
}

// Column constructors.

func i16(name string, v int16) column    { return column{name: name, typ: "smallint", val: int64(v)} }
func i32(name string, v int32) column    { return column{name: name, typ: "integer", val: int64(v)} }
func i64(name string, v int64) column    { return column{name: name, typ: "bigint", val: v} }
func msCol(name string, v *int64) column { return column{name: name, typ: "bigint", val: nullMs(v)} }
func text(name string, v any) column     { return column{name: name, typ: "text", val: v} }
func uuidCol(name string, v any) column  { return column{name: name, typ: "uuid", val: v} }
func jsonb(name string, v any) column    { return column{name: name, typ: "jsonb", val: v} }
func boolCol(name string, v bool) column { return column{name: name, typ: "boolean", val: v} }
func texts(name string, v []string) column {
	return column{name: name, typ: "text[]", val: v}
}
