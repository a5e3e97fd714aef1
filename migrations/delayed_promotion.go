package migrations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
)

// PromoteFunctionName is the SQL function, in River's schema, through which
// a service in any language enqueues an ad-hoc promotion inside its own
// transaction: the job a Go client inserts for jobs.PromoteArgs{Partition,
// ExecutionID, At}, byte for byte, unique key included.
const PromoteFunctionName = "ffreconcile_promote"

// PromoteFunctionVersion is the version of the function this build installs,
// recorded in the function's comment. A fleet refuses to start on an older
// one (CheckPromoteFunction). Bump it whenever the function's SQL changes;
// TestPromoteFunctionVersionPinsItsSQL fails until you do.
const PromoteFunctionVersion = 1

// promoteCommentRE reads the version back from the function's comment.
var promoteCommentRE = regexp.MustCompile(`^` + PromoteFunctionName + ` version ([0-9]+)\b`)

// uniqueStatesBitmask is River's unique_states encoding of states: bit 7-i
// for the state at River's position i (uniquestates.UniqueStatesToBitmask,
// in a package River does not promise to keep; the contract test compares
// the function's rows with a Go client's).
func uniqueStatesBitmask(states []rivertype.JobState) byte {
	positions := map[rivertype.JobState]uint{
		rivertype.JobStateAvailable: 7, rivertype.JobStateCancelled: 6, rivertype.JobStateCompleted: 5,
		rivertype.JobStateDiscarded: 4, rivertype.JobStatePending: 3, rivertype.JobStateRetryable: 2,
		rivertype.JobStateRunning: 1, rivertype.JobStateScheduled: 0,
	}
	var mask byte
	for _, s := range states {
		if i, ok := positions[s]; ok {
			mask |= 1 << (7 - i)
		}
	}
	return mask
}

// PromoteFunctionSQL returns the DDL of the function in schema: CREATE OR
// REPLACE, then the comment carrying its version. Everything the job is
// made of (kind, queue, attempts, tags, unique states, the scheduling lead)
// comes from jobs.PromoteArgs itself, so the function cannot drift from
// what Go clients insert without this package's tests noticing; unique
// options the SQL does not reproduce are refused here.
//
// What a Go client does, and the function repeats:
//   - args are PromoteArgs' JSON, {"partition":P,"execution_id":"<uuid>"}
//     and, with at, "at" in RFC 3339 with the fraction's trailing zeros
//     dropped, in UTC (PromoteArgs.MarshalJSON), whatever the session's
//     TimeZone;
//   - unique_key is River's: SHA-256 of "&kind=<kind>&args=<json>", the
//     JSON holding the unique fields present, sorted by name
//     (internal/dbunique.buildUniqueKeyString with ByArgs only);
//   - scheduled_at is at minus River's scheduler interval when that is
//     still ahead of the clock (state scheduled), else now() (available),
//     as PromoteArgs.InsertOpts decides with time.Now();
//   - the insert is River's JobInsertFastMany: ON CONFLICT on River's unique
//     index, a conflict returning the queued job (xmax <> 0);
//   - an available job is announced as River's client does (pg_notify on
//     "<schema>.river_insert", {"queue": "<queue>"}), delivered at commit,
//     by one of the transactions calling at once (see the template).
//
// It runs with the caller's rights (INSERT and UPDATE on river_job, USAGE
// on its sequence) and a fixed search_path, so a caller's search_path
// cannot change what its names mean.
func PromoteFunctionSQL(schema string) (string, error) {
	if err := ValidateSchemaName(schema); err != nil {
		return "", err
	}
	var args jobs.PromoteArgs
	opts := args.InsertOpts()
	u := opts.UniqueOpts
	if !u.ByArgs || u.ByQueue || u.ByPeriod != 0 || u.ExcludeKind || len(u.ByState) == 0 {
		return "", errors.New("promote function: PromoteArgs' unique options are not ByArgs + ByState only, which is all the SQL reproduces")
	}
	if jobs.RiverSchedulerInterval%1000 != 0 {
		return "", errors.New("promote function: River's scheduler interval is not whole microseconds")
	}
	tags := make([]string, len(opts.Tags))
	for i, t := range opts.Tags {
		tags[i] = quoteLiteral(t)
	}
	s := pgx.Identifier{schema}.Sanitize()
	repl := strings.NewReplacer(
		"$SCHEMA", s,
		"$NAME", PromoteFunctionName,
		"$KIND", quoteLiteral(args.Kind()),
		"$KEY_PREFIX", quoteLiteral("&kind="+args.Kind()+"&args="),
		"$QUEUE", quoteLiteral(opts.Queue),
		"$MAX_ATTEMPTS", strconv.Itoa(opts.MaxAttempts),
		// River's default priority (rivercommon.PriorityDefault).
		"$PRIORITY", strconv.Itoa(cmp.Or(opts.Priority, 1)),
		"$TAGS", "ARRAY["+strings.Join(tags, ", ")+"]::varchar(255)[]",
		"$UNIQUE_STATES", fmt.Sprintf("B'%08b'", uniqueStatesBitmask(u.ByState)),
		"$LEAD", quoteLiteral(fmt.Sprintf("%d microseconds", jobs.RiverSchedulerInterval.Microseconds())),
		"$AT_MIN", quoteLiteral(jobs.PromoteAtMin.Format("2006-01-02 15:04:05Z07:00")),
		"$AT_MAX", quoteLiteral(jobs.PromoteAtMax.Format("2006-01-02 15:04:05Z07:00")),
		"$CHANNEL", quoteLiteral(schema+".river_insert"),
		"$NOTIFY_LOCK", strconv.FormatInt(notifyLockKey(schema, opts.Queue), 10),
		"$PAYLOAD", quoteLiteral(fmt.Sprintf("{\"queue\": %q}", opts.Queue)),
		"$COMMENT", quoteLiteral(fmt.Sprintf("%s version %d: enqueues the ad-hoc promotion jobs.PromoteArgs{Partition, ExecutionID, At} "+
			"exactly as River's Go client would, in the caller's transaction. Installed by `worker migrate`; do not edit.",
			PromoteFunctionName, PromoteFunctionVersion)),
	)
	return repl.Replace(promoteFunctionTemplate), nil
}

// promoteFunctionTemplate is the function, with $NAMES replaced by
// PromoteFunctionSQL. Parameters are referred to by the function's name
// (partition and at are SQL keywords). A version that changes the
// signature or the returned columns must DROP the function first: CREATE
// OR REPLACE cannot change them.
const promoteFunctionTemplate = `CREATE OR REPLACE FUNCTION $SCHEMA.$NAME(
    partition smallint,
    execution_id uuid,
    at timestamptz DEFAULT NULL
) RETURNS TABLE (job_id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_at       text;
    v_frac     text;
    v_args     text;
    v_unique   text;
    v_sched    timestamptz;
    v_state    $SCHEMA.river_job_state;
BEGIN
    IF $NAME.partition IS NULL THEN
        RAISE EXCEPTION '$NAME: partition must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $NAME.partition < 0 OR $NAME.partition > 255 THEN
        RAISE EXCEPTION '$NAME: partition % is out of range 0..255', $NAME.partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $NAME.execution_id IS NULL THEN
        RAISE EXCEPTION '$NAME: execution_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF $NAME.at IS NOT NULL AND NOT ($NAME.at >= $AT_MIN::timestamptz AND $NAME.at < $AT_MAX::timestamptz) THEN
        RAISE EXCEPTION '$NAME: at % is outside years 0001..9999 (UTC)', $NAME.at
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'at is a timestamptz: from epoch milliseconds, to_timestamp(ms / 1000.0)';
    END IF;

    -- PromoteArgs' JSON, field order included; "at" in UTC with Go's
    -- RFC 3339 fraction (trailing zeros dropped, none when whole).
    IF $NAME.at IS NOT NULL THEN
        v_at := to_char($NAME.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS');
        v_frac := rtrim(to_char($NAME.at AT TIME ZONE 'UTC', 'US'), '0');
        IF v_frac <> '' THEN
            v_at := v_at || '.' || v_frac;
        END IF;
        v_at := v_at || 'Z';
    END IF;
    v_args := '{"partition":' || $NAME.partition::text
        || ',"execution_id":"' || $NAME.execution_id::text || '"'
        || CASE WHEN v_at IS NULL THEN '' ELSE ',"at":"' || v_at || '"' END
        || '}';
    -- River's unique args: the unique fields present, sorted by name.
    v_unique := '{'
        || CASE WHEN v_at IS NULL THEN '' ELSE '"at":"' || v_at || '",' END
        || '"execution_id":"' || $NAME.execution_id::text || '"'
        || ',"partition":' || $NAME.partition::text
        || '}';

    -- PromoteArgs.InsertOpts: one scheduler interval ahead of at while
    -- that is still ahead of the clock (not of the transaction's start).
    IF $NAME.at IS NOT NULL AND $NAME.at - $LEAD::interval > clock_timestamp() THEN
        v_sched := $NAME.at - $LEAD::interval;
        v_state := 'scheduled';
    ELSE
        v_sched := now();
        v_state := 'available';
    END IF;

    INSERT INTO $SCHEMA.river_job AS j
        (args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags, unique_key, unique_states)
    VALUES
        (v_args::jsonb, now(), $KIND, $MAX_ATTEMPTS, '{}'::jsonb, $PRIORITY, $QUEUE, v_sched, v_state, $TAGS,
         sha256(convert_to($KEY_PREFIX || v_unique, 'UTF8')), $UNIQUE_STATES)
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL
          AND unique_states IS NOT NULL
          AND $SCHEMA.river_job_state_in_bitmask(unique_states, state)
        -- As River: a conflict must update something to return the row.
        DO UPDATE SET kind = j.kind
    RETURNING j.id, (j.xmax <> 0) INTO job_id, duplicate;

    -- River's notification, from one of the transactions calling at once:
    -- a NOTIFY holds a database-wide lock through its commit, so one from
    -- every call would commit them one at a time. The others' jobs are
    -- fetched with the winner's or, at worst, at the fleet's next poll, as
    -- River's Go client, which notifies a queue once per fetch cooldown.
    IF NOT duplicate AND v_state = 'available' THEN
        IF pg_try_advisory_xact_lock($NOTIFY_LOCK) THEN
            PERFORM pg_notify($CHANNEL, $PAYLOAD);
        END IF;
    END IF;
    RETURN NEXT;
END
$fn$;
COMMENT ON FUNCTION $SCHEMA.$NAME(smallint, uuid, timestamptz) IS $COMMENT;
`

// notifyLockKey is the transaction-scoped advisory lock the function's
// callers take, without waiting, to decide which of them sends the insert
// notification for queue in schema (a 64-bit FNV-1a of both: callers of
// different River schemas do not share it).
func notifyLockKey(schema, queue string) int64 {
	h := fnv.New64a()
	h.Write([]byte("ffreconcile_promote notify " + schema + "." + queue))
	return int64(h.Sum64())
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// PromoteFunctionResult says what ApplyPromoteFunction found and left.
type PromoteFunctionResult struct {
	// Found: the function was there; Previous is the version its comment
	// recorded (0 when it records none).
	Found    bool
	Previous int
	// Installed is the version in place now: PromoteFunctionVersion, or a
	// newer one left alone (a newer build migrated this database).
	Installed int
}

// ApplyPromoteFunction installs the promote function in River's schema, or
// replaces it in place: callers in flight are not disturbed and nothing is
// dropped. A newer version than this build's is left as it is, so an older
// `worker migrate` never downgrades what newer fleets require.
func ApplyPromoteFunction(ctx context.Context, pool *pgxpool.Pool, schema string) (PromoteFunctionResult, error) {
	ddl, err := PromoteFunctionSQL(schema)
	if err != nil {
		return PromoteFunctionResult{}, err
	}
	var res PromoteFunctionResult
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Two CREATE OR REPLACE at once fail with "tuple concurrently
		// updated"; serialise them as the other migrations do.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrations.promote_function'))`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		found, version, err := installedPromoteFunction(ctx, tx, schema)
		if err != nil {
			return err
		}
		res.Found, res.Previous = found, version
		if version > PromoteFunctionVersion {
			res.Installed = version
			return nil
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return err
		}
		res.Installed = PromoteFunctionVersion
		return nil
	})
	if err != nil {
		return PromoteFunctionResult{}, fmt.Errorf("promote function %s.%s: %w", schema, PromoteFunctionName, err)
	}
	return res, nil
}

// installedPromoteFunction reports whether the function exists in schema and
// the version its comment records (0 when unreadable: treated as older).
func installedPromoteFunction(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string) (bool, int, error) {
	var found bool
	var comment *string
	// pg_proc read as a table, with the statement's snapshot: a lookup
	// through the catalog cache (to_regprocedure) can miss a function
	// another transaction created and committed while this one waited for
	// the advisory lock, since taking an advisory lock processes no cache
	// invalidations (two of four concurrent applies then found none).
	err := q.QueryRow(ctx, `
		SELECT count(*) > 0, max(obj_description(p.oid, 'pg_proc'))
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = $1 AND p.proname = $2
		   AND p.proargtypes = array_to_string(ARRAY['smallint'::regtype, 'uuid'::regtype, 'timestamptz'::regtype]::oid[], ' ')::oidvector`,
		schema, PromoteFunctionName).Scan(&found, &comment)
	if err != nil {
		return false, 0, fmt.Errorf("read catalog: %w", err)
	}
	if !found || comment == nil {
		return found, 0, nil
	}
	m := promoteCommentRE.FindStringSubmatch(*comment)
	if m == nil {
		return true, 0, nil
	}
	v, err := strconv.Atoi(m[1])
	if err != nil {
		return true, 0, nil
	}
	return true, v, nil
}

// CheckPromoteFunction reports, with the fix, that the promote function is
// missing from River's schema or older than this build's: other services'
// calls would then fail, or insert jobs this fleet no longer expects.
func CheckPromoteFunction(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	found, version, err := installedPromoteFunction(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("check promote function: %w", err)
	}
	name := schema + "." + PromoteFunctionName
	switch {
	case !found:
		return fmt.Errorf("the promote function %s is missing; run `worker migrate` (with --river-schema %s) to install it", name, schema)
	case version < PromoteFunctionVersion:
		return fmt.Errorf("the promote function %s is version %d, older than this worker's %d; run `worker migrate` (with --river-schema %s) to replace it",
			name, version, PromoteFunctionVersion, schema)
	}
	return nil
}

// promoteFunctionObject is the promote function as delayed promotion's
// Object: `worker migrate` installs it, a fleet running delayed promotion
// checks it.
func promoteFunctionObject() Object {
	ddl, err := PromoteFunctionSQL(jobs.DefaultRiverSchema)
	if err != nil {
		ddl = err.Error() // a change to it still changes the fingerprint
	}
	return Object{
		Name: PromoteFunctionName, DDL: ddl,
		Apply: func(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error) {
			r, err := ApplyPromoteFunction(ctx, pool, schema)
			if err != nil {
				return "", err
			}
			return r.report(schema), nil
		},
		Check: CheckPromoteFunction,
	}
}

func init() { register(promoteFunctionObject()) }

// report is `worker migrate`'s line about the function in schema.
func (r PromoteFunctionResult) report(schema string) string {
	name := schema + "." + PromoteFunctionName
	switch {
	case r.Installed > PromoteFunctionVersion:
		return fmt.Sprintf("promote function: %s version %d is newer than this worker's %d; left in place", name, r.Installed, PromoteFunctionVersion)
	case !r.Found:
		return fmt.Sprintf("promote function: installed %s version %d", name, r.Installed)
	case r.Previous < r.Installed:
		return fmt.Sprintf("promote function: replaced %s version %d with version %d", name, r.Previous, r.Installed)
	}
	return fmt.Sprintf("promote function: %s version %d is in place", name, r.Installed)
}
