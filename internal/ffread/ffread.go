// Package ffread is FlowFabric's own Postgres readers and writers,
// transcribed into Go: tests call it to check that what the fleet writes
// into ff_* tables reads back through FlowFabric's API the way a FlowFabric
// user would see it, and to drive rows through the FlowFabric operations
// (cancel, deliver signal, claim resumed, resume) a user would run on them.
//
// Every function cites the FlowFabric function it transcribes (v0.15.0,
// commit 0def596, crates/ff-backend-postgres/src unless said otherwise;
// copies under shared/flowfabric/src). The SQL is FlowFabric's, with the
// same gates, normalisation and error conditions, and the error text is
// FlowFabric's. Where the Go differs it says why; the usual reason is that
// sqlx declares each parameter's type from the bound Rust value while pgx
// lets the server infer it, so a few parameters carry an explicit cast to
// the type sqlx would have sent.
//
// Executions are named as in ff_exec_core: a partition (partition_key) and
// a bare UUID. FlowFabric's messages quote the wire form "{fp:N}:<uuid>",
// and so do the errors here.
//
// The package imports nothing of this project, so it keeps FlowFabric's
// behaviour even where ours differs.
package ffread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the readers need: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TxDB is a DB that can begin a transaction, for the operations FlowFabric
// runs as one: *pgxpool.Pool and *pgx.Conn satisfy it, and so does pgx.Tx
// (a savepoint), except for the SERIALIZABLE operations (CancelExecution,
// DeliverSignalSatisfied), whose SET TRANSACTION must be a transaction's
// first statement.
type TxDB interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ValidationKind is the kind of an ff_core EngineError::Validation, as its
// Debug form prints it.
type ValidationKind string

// The validation kinds FlowFabric's transcribed paths return.
const (
	// Corruption: a stored value is not one FlowFabric can read
	// (for example a state literal that is no serde variant).
	Corruption ValidationKind = "Corruption"
	// InvalidInput: the request does not fit the row (for example a
	// cancel of an execution already terminal in another state).
	InvalidInput ValidationKind = "InvalidInput"
)

// ValidationError is FlowFabric's EngineError::Validation. Error() prints
// it as FlowFabric's Display does ("validation: Corruption: <detail>"), so
// Detail is FlowFabric's message text verbatim.
type ValidationError struct {
	Kind   ValidationKind
	Detail string
}

func (e *ValidationError) Error() string {
	return "validation: " + string(e.Kind) + ": " + e.Detail
}

func corruption(format string, args ...any) error {
	return &ValidationError{Kind: Corruption, Detail: fmt.Sprintf(format, args...)}
}

func invalidInput(format string, args ...any) error {
	return &ValidationError{Kind: InvalidInput, Detail: fmt.Sprintf(format, args...)}
}

// ErrNotFound is what every NotFoundError matches with errors.Is.
var ErrNotFound = errors.New("not found")

// NotFoundError is FlowFabric's EngineError::NotFound { entity }: the
// entity ("execution", "suspension", …) does not exist. It matches
// ErrNotFound.
type NotFoundError struct {
	Entity string
}

func (e *NotFoundError) Error() string { return "not found: " + e.Entity }

// Is makes errors.Is(err, ErrNotFound) hold for every entity.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// FlowFabric's typed errors without a payload, with its Display text.
var (
	// ErrNotAResumedExecution is Contention(NotAResumedExecution):
	// claim_resumed_execution found public_state other than 'resumable'.
	ErrNotAResumedExecution = errors.New("contention: NotAResumedExecution")
	// ErrExecutionNotSuspended is State(ExecutionNotSuspended):
	// resume_execution found lifecycle_phase other than 'suspended', or no
	// ff_suspension_current row.
	ErrExecutionNotSuspended = errors.New("state: ExecutionNotSuspended")
	// ErrStaleLease is State(StaleLease): cancel_execution's lease fence
	// did not match the current attempt's lease_epoch.
	ErrStaleLease = errors.New("state: StaleLease")
	// ErrRetryExhausted is Contention(RetryExhausted): a SERIALIZABLE
	// operation hit a serialization failure or deadlock on every one of
	// its three attempts.
	ErrRetryExhausted = errors.New("contention: RetryExhausted")
)

// execKey is one execution: its partition, its UUID in canonical
// (lowercase, hyphenated) form as Rust's Uuid prints it, and its wire form
// for messages.
type execKey struct {
	part int16
	id   string
	wire string
}

// parseExec checks id is a UUID, as FlowFabric's ExecutionId constructors
// guarantee before any SQL runs (split_exec_id, suspend_ops.rs:60-81).
func parseExec(op string, partition int16, id string) (execKey, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return execKey{}, invalidInput("%s: execution_id UUID invalid: %s", op, id)
	}
	s := u.String()
	return execKey{part: partition, id: s, wire: wireID(partition, s)}, nil
}

// wireID is FlowFabric's ExecutionId wire form, "{fp:N}:<uuid>"
// (ff-core types.rs:143).
func wireID(partition int16, id string) string {
	return fmt.Sprintf("{fp:%d}:%s", partition, id)
}

// nowMs is FlowFabric's now_ms(): wall-clock epoch milliseconds.
func nowMs() int64 { return max(time.Now().UnixMilli(), 0) }

// dbErr wraps a database error with the operation and execution it ran for.
func dbErr(op string, k execKey, err error) error {
	return fmt.Errorf("ffread: %s %s: %w", op, k.wire, err)
}

// retryable reports whether err is a serialization failure or deadlock,
// the two SQLSTATEs FlowFabric retries (map_sqlx_error, error.rs:44;
// is_retryable_serialization, signal.rs:49-57).
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// maxSerializableAttempts is FlowFabric's SERIALIZABLE retry budget
// (operator.rs MAX_ATTEMPTS, signal.rs SERIALIZABLE_RETRY_BUDGET).
const maxSerializableAttempts = 3

// rollback ends tx when the operation returns early; its error is of no
// interest once the operation has failed or decided to change nothing.
func rollback(ctx context.Context, tx pgx.Tx) { _ = tx.Rollback(ctx) }
