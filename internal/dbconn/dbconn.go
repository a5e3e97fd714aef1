// Package dbconn opens pgx pools with errors that name the problem and never
// carry a password.
package dbconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is used when no database URL is configured: the ffreconcile
// database of the local server that `make run` starts or finds and works in
// (one default for the binary and the Makefile, so a bare `worker migrate`
// never installs River's tables into the server's maintenance database),
// over loopback, where TLS would only cost CPU on both ends (see
// scripts/ensure-postgres.sh).
const DefaultURL = "postgres://postgres@127.0.0.1:5432/ffreconcile?sslmode=disable"

// cancelGrace is how long a connection whose statement's context ended
// waits for the server to cancel it before the connection is closed: long
// enough for a busy server to fork the backend that takes the cancel
// request, short beside a server that no longer answers at all.
const cancelGrace = 10 * time.Second

// DefaultAdminURL is the same server's maintenance database, for what
// creates and drops databases of its own (tests, benchmarks).
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// missingDatabaseHint is added to a connection error whose database does not
// exist, with the one command that makes it usable: a database created
// without its tables would only fail next on those.
const missingDatabaseHint = "; create it with its tables: `worker migrate --create-database --ff-schema` (what `make run` does; " +
	"against a database FlowFabric migrates, create it, run FlowFabric's migrations, then `worker migrate`)"

// noServerHint is added to a connection error that never reached a
// PostgreSQL server (refused, unresolvable, timed out): where one comes from.
const noServerHint = "; is PostgreSQL running there? `make run` starts a local one when DATABASE_URL is unset, " +
	"or point --database-url (DATABASE_URL) at a running server"

// hintFor returns the hint for a failed connection: how to create a
// missing database, or where a server comes from when none answered.
func hintFor(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "3D000" { // invalid_catalog_name
			return missingDatabaseHint
		}
		return "" // a server answered: its message says what is wrong
	}
	var netErr net.Error
	var dnsErr *net.DNSError
	if errors.As(err, &netErr) || errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) {
		return noServerHint
	}
	return ""
}

var urlPasswordRE = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)

var kvPasswordRE = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// Redact returns dsn with any password replaced by "xxxxx"; it accepts URL
// and key=value forms and is safe to log.
func Redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			}
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	// Key/value form, or a URL too malformed to parse: scrub both shapes.
	dsn = urlPasswordRE.ReplaceAllString(dsn, "${1}xxxxx@")
	return kvPasswordRE.ReplaceAllString(dsn, "${1}xxxxx")
}

// password extracts the password of dsn, if any, so it can be scrubbed from
// error messages produced by libraries.
func password(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	return cfg.Password
}

// Scrub removes dsn's password (and the whole dsn) from err's message.
func Scrub(err error, dsn string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if dsn != "" {
		msg = strings.ReplaceAll(msg, dsn, Redact(dsn))
	}
	if pw := password(dsn); len(pw) >= 1 {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}

// Options tunes a pool.
type Options struct {
	MaxConns int32
	MinConns int32
	// AppName is sent as application_name, visible in pg_stat_activity.
	AppName string
	// RuntimeParams are extra session settings.
	RuntimeParams map[string]string
	// Tracer, when set, traces every statement (OpenTelemetry).
	Tracer pgx.QueryTracer
	// CancelOnServer has a statement whose context ends (a job's timeout)
	// cancelled by the server, and the connection lives on; pgx's default
	// closes it, and with it all its backend has cached. A tick's first
	// plan over 256 partitions builds the cache of every child and index:
	// on a busy server each retry started that over on a new backend and
	// timed out again (a chaos run saw every tick of a fresh fleet time
	// out for 90 s). Only a server that ignores the cancel for cancelGrace
	// gets the connection closed. Not for a pool whose connections wait
	// for notifications: River's listener and ours interrupt the wait by
	// ending its context, which an idle backend's cancel cannot answer,
	// so each interruption would take cancelGrace.
	CancelOnServer bool
	// Lazy opens no connection until the pool's first use: no ping, for a
	// pool of a server another pool of the process has reached already.
	Lazy bool
}

// Validate checks that dsn parses, without connecting.
func Validate(dsn string) error {
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return fmt.Errorf("invalid database URL %s: %w", Redact(dsn), Scrub(unwrapParse(err), dsn))
	}
	return nil
}

// Open parses dsn, opens a pool and pings it, so an unreachable database or
// a wrong password fails here with one clear line.
func Open(ctx context.Context, dsn string, opts Options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %w", Redact(dsn), Scrub(unwrapParse(err), dsn))
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if opts.MinConns > 0 {
		cfg.MinConns = opts.MinConns
	}
	if opts.AppName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = opts.AppName
	}
	// JIT off unless asked for: none of our statements reads enough rows
	// to pay for compiling, while a plan over 256 partitions is costed far
	// past jit_above_cost (the oldest-due probe `worker status` runs took
	// 17 s with JIT on a default server, 0.2 s without; a tick's generic
	// plan spent 1.2 s a run compiling and outran its 2 s interval).
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	if opts.CancelOnServer {
		cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
		}
	}
	for k, v := range opts.RuntimeParams {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if opts.Tracer != nil {
		cfg.ConnConfig.Tracer = opts.Tracer
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", Redact(dsn), Scrub(err, dsn))
	}
	if opts.Lazy {
		return pool, nil
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach database %s: %w%s", Redact(dsn), Scrub(fold(err), dsn), hintFor(err))
	}
	return pool, nil
}

// unwrapParse drops pgx's parse-error wrapper, which repeats the whole
// connection string.
func unwrapParse(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// folded is an error whose message was rewritten; it still unwraps to the
// original.
type folded struct {
	msg string
	err error
}

func (f *folded) Error() string { return f.msg }
func (f *folded) Unwrap() error { return f.err }

// fold puts pgx's connect error on one line with each distinct attempt
// once: pgx lists one line per attempt, and with sslmode=prefer (libpq's
// default) an address is tried with TLS and then without, which fail alike
// when nothing listens, so the cause was printed twice.
func fold(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	prefix, details, ok := strings.Cut(ce.Error(), ":")
	if !ok {
		return err
	}
	// The details are one attempt per line, or several joined by spaces
	// when they were already folded; split on the line breaks only.
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(details, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return &folded{msg: prefix + ": " + strings.Join(out, "; "), err: err}
}

// CreateIfMissing creates the database dsn names when the server says it
// does not exist, connecting to the server's postgres database to do so,
// and reports whether it did. Any other connection failure is returned as
// Open would report it.
func CreateIfMissing(ctx context.Context, dsn string) (bool, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, fmt.Errorf("invalid database URL %s: %w", Redact(dsn), Scrub(unwrapParse(err), dsn))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return false, conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return false, fmt.Errorf("cannot reach database %s: %w%s", Redact(dsn), Scrub(fold(err), dsn), hintFor(err))
	}
	name := cfg.Database
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("create database %s: connect to the server's postgres database: %w", name, Scrub(fold(err), dsn))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
			return false, nil
		}
		return false, fmt.Errorf("create database %s: %w", name, Scrub(err, dsn))
	}
	return true, nil
}
