// Package dbconn opens pgx pools with errors that name the problem and never
// carry a password.
package dbconn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is used when no database URL is configured: the local server
// that `make run` starts or finds, over loopback, where TLS would only cost
// CPU on both ends (see scripts/ensure-postgres.sh).
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

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
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach database %s: %w", Redact(dsn), Scrub(err, dsn))
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
