package ffread

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ReadExecutionState is read_execution_state_impl (exec_core.rs:851-880):
// the execution's public_state, normalised ('running' reads as 'active')
// and checked against PublicState's variants. ok is false when the row is
// missing; an unknown literal is a Corruption error
// "exec_core: public_state: '<raw>' is not a known value: …".
func ReadExecutionState(ctx context.Context, db DB, partition int16, executionID string) (state string, ok bool, err error) {
	k, err := parseExec("read_execution_state", partition, executionID)
	if err != nil {
		return "", false, err
	}
	var raw string
	err = db.QueryRow(ctx, `
        SELECT public_state
        FROM ff_exec_core
        WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, dbErr("read_execution_state", k, err)
	}
	state, err = jsonEnum("public_state", normalisePublicState(raw), publicStates)
	if err != nil {
		return "", false, err
	}
	return state, true, nil
}

// StateVector is ff-core's StateVector (state.rs:216-227): each dimension
// as its serde snake_case variant.
type StateVector struct {
	LifecyclePhase   string
	OwnershipState   string
	EligibilityState string
	BlockingReason   string
	TerminalOutcome  string
	AttemptState     string
	PublicState      string
}

// ExecutionInfo is ff-core's ExecutionInfo as read_execution_info_impl
// builds it. Times are strings of epoch milliseconds, as FlowFabric's are.
type ExecutionInfo struct {
	Partition   int16
	ExecutionID string // bare UUID (FlowFabric's is the "{fp:N}:<uuid>" wire form)
	// Namespace, ExecutionKind and BlockingDetail come from raw_fields,
	// when they are JSON strings there ("" otherwise).
	Namespace      string
	LaneID         string
	Priority       int32
	ExecutionKind  string
	StateVector    StateVector
	PublicState    string // the same value as StateVector.PublicState
	CreatedAt      string
	StartedAt      *string // started_at_ms, set once at first claim
	CompletedAt    *string // terminal_at_ms
	BlockingDetail string
	// CurrentAttemptIndex is attempt_index, negatives read as 0.
	CurrentAttemptIndex uint32
	// FlowID is the bare flow UUID; nil for a standalone execution.
	FlowID *string
}

// ReadExecutionInfo is read_execution_info_impl (exec_core.rs:882-1045): one
// SELECT of the execution with a LATERAL join on its current attempt's
// outcome. Each state column is normalised (normalise_*, l.744-812) and
// must then be a variant of its ff-core enum, else a Corruption error
// "exec_core: <field>: '<raw>' is not a known value: …", checked in
// FlowFabric's order (lifecycle_phase, ownership_state, eligibility_state,
// public_state, attempt_state, blocking_reason). blocking_reason NULL or ""
// is "none" and is otherwise not normalised. terminal_outcome is
// derive_terminal_outcome (l.827-849) of the raw and normalised phase and
// the current attempt's outcome. It returns nil, nil when the row is
// missing.
func ReadExecutionInfo(ctx context.Context, db DB, partition int16, executionID string) (*ExecutionInfo, error) {
	k, err := parseExec("read_execution_info", partition, executionID)
	if err != nil {
		return nil, err
	}
	var (
		flowID                                                        *string
		lane                                                          string
		priority                                                      int32
		phaseRaw, ownershipRaw, eligibilityRaw, publicRaw, attemptRaw string
		blocking                                                      *string
		attemptIndex                                                  int32
		createdAt                                                     int64
		terminalAt, startedAt                                         *int64
		rawFields                                                     []byte
		attemptOutcome                                                *string
	)
	err = db.QueryRow(ctx, `
        SELECT ec.flow_id,
               ec.lane_id,
               ec.priority,
               ec.lifecycle_phase,
               ec.ownership_state,
               ec.eligibility_state,
               ec.public_state,
               ec.attempt_state,
               ec.blocking_reason,
               ec.attempt_index,
               ec.created_at_ms,
               ec.terminal_at_ms,
               ec.started_at_ms,
               ec.raw_fields,
               cur.outcome       AS attempt_outcome
        FROM ff_exec_core ec
        LEFT JOIN LATERAL (
            SELECT outcome
            FROM ff_attempt
            WHERE partition_key = ec.partition_key
              AND execution_id  = ec.execution_id
              AND attempt_index = ec.attempt_index
        ) cur ON TRUE
        WHERE ec.partition_key = $1 AND ec.execution_id = $2
        `, k.part, k.id).Scan(&flowID, &lane, &priority, &phaseRaw, &ownershipRaw, &eligibilityRaw, &publicRaw,
		&attemptRaw, &blocking, &attemptIndex, &createdAt, &terminalAt, &startedAt, &rawFields, &attemptOutcome)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr("read_execution_info", k, err)
	}

	var sv StateVector
	for _, c := range []struct {
		field, raw string
		variants   []string
		out        *string
	}{
		{"lifecycle_phase", normaliseLifecyclePhase(phaseRaw), lifecyclePhases, &sv.LifecyclePhase},
		{"ownership_state", normaliseOwnershipState(ownershipRaw), ownershipStates, &sv.OwnershipState},
		{"eligibility_state", normaliseEligibilityState(eligibilityRaw), eligibilityStates, &sv.EligibilityState},
		{"public_state", normalisePublicState(publicRaw), publicStates, &sv.PublicState},
		{"attempt_state", normaliseAttemptState(attemptRaw), attemptStates, &sv.AttemptState},
	} {
		if *c.out, err = jsonEnum(c.field, c.raw, c.variants); err != nil {
			return nil, err
		}
	}
	sv.BlockingReason = "none"
	if blocking != nil && *blocking != "" {
		if sv.BlockingReason, err = jsonEnum("blocking_reason", *blocking, blockingReasons); err != nil {
			return nil, err
		}
	}
	sv.TerminalOutcome = deriveTerminalOutcome(normaliseLifecyclePhase(phaseRaw), phaseRaw, attemptOutcome)

	raw := rawFieldStrings(rawFields)
	info := &ExecutionInfo{
		Partition:           k.part,
		ExecutionID:         k.id,
		Namespace:           raw["namespace"],
		LaneID:              lane,
		Priority:            priority,
		ExecutionKind:       raw["execution_kind"],
		StateVector:         sv,
		PublicState:         sv.PublicState,
		CreatedAt:           strconv.FormatInt(createdAt, 10),
		StartedAt:           msString(startedAt),
		CompletedAt:         msString(terminalAt),
		BlockingDetail:      raw["blocking_detail"],
		CurrentAttemptIndex: uint32(max(attemptIndex, 0)),
		FlowID:              flowID,
	}
	return info, nil
}

func msString(v *int64) *string {
	if v == nil {
		return nil
	}
	s := strconv.FormatInt(*v, 10)
	return &s
}

// rawFieldStrings returns the members of raw_fields that are JSON strings,
// the only ones FlowFabric reads (`if let Some(JsonValue::String(s))`); a
// raw_fields that is not an object gives none.
func rawFieldStrings(rawFields []byte) map[string]string {
	var obj map[string]json.RawMessage
	if !isJSONObject(rawFields) || json.Unmarshal(rawFields, &obj) != nil {
		return map[string]string{}
	}
	out := make(map[string]string, len(obj))
	for key, v := range obj {
		var s string
		if isJSONString(v) && json.Unmarshal(v, &s) == nil {
			out[key] = s
		}
	}
	return out
}

// isJSONObject and the like tell JSON values apart by their first byte:
// encoding/json decodes null into a map or slice without complaint, where
// serde_json's as_object/as_array say None.
func isJSONObject(b []byte) bool { return firstByte(b) == '{' }
func isJSONArray(b []byte) bool  { return firstByte(b) == '[' }
func isJSONString(b []byte) bool { return firstByte(b) == '"' }

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// ExecutionSnapshot is what describe_execution returns on Postgres: ff-core's
// ExecutionSnapshot less what the Postgres path can never fill. It has no
// flow id: a flow member's describe fails (see DescribeExecution). It has
// no lease: describe_execution_impl never copies current_worker_instance_id
// or lease_expires_at into the map, so build_lease_summary always finds
// no lease.
type ExecutionSnapshot struct {
	Partition   int16
	ExecutionID string
	LaneID      string
	Namespace   string
	// PublicState is the raw column, which had to be a PublicState variant
	// as stored ('running' is an error here).
	PublicState string
	// BlockingReason is the raw column, "" when NULL or empty (FlowFabric's
	// None); it is not checked against BlockingReason's variants.
	BlockingReason string
	// BlockingDetail is raw_fields.blocking_detail, "" when absent or empty.
	BlockingDetail string
	CreatedAtMs    int64
	// LastMutationAtMs is raw_fields.last_mutation_at, which must be there.
	LastMutationAtMs int64
	// TotalAttemptCount is raw_fields.total_attempt_count, 0 when absent.
	TotalAttemptCount uint32
	// CurrentAttempt is set when raw_fields.current_attempt_id is.
	CurrentAttempt *AttemptSummary
	// CurrentWaitpointID is raw_fields.current_waitpoint_id, "" when absent
	// or empty.
	CurrentWaitpointID string
	// Tags are raw_fields.tags' string members.
	Tags map[string]string
}

// AttemptSummary is ff-core's AttemptSummary.
type AttemptSummary struct {
	AttemptID    string
	AttemptIndex uint32
}

// describeCtx is build_execution_snapshot's error context.
const describeCtx = "describe_execution: exec_core"

// DescribeExecution is describe_execution_impl (exec_core.rs:214-300) with
// the shared decoder it calls, build_execution_snapshot
// (ff-core/src/contracts/decode.rs:228-329; parse_public_state l.397-408,
// build_attempt_summary l.410-440, build_lease_summary l.442-514), with
// the decoder's gates in its order:
//   - public_state is NOT normalised, unlike the read_* paths: the raw
//     literal must be a PublicState variant, so the 'running' most claim
//     paths write is a Corruption error "describe_execution: exec_core:
//     public_state: 'running' is not a known public state: …";
//   - the lane must pass LaneId::try_new (non-empty, at most 64 bytes,
//     ASCII-printable);
//   - the flow id: the Postgres path puts "{fp:N}:<uuid>" into the map and
//     the decoder parses it with FlowId::parse, a plain Uuid::parse_str,
//     which rejects that shape, so every execution with a flow_id fails
//     with "… flow_id: is not a valid UUID (key corruption?): invalid
//     character: …";
//   - raw_fields must hold last_mutation_at, a string of an i64
//     (FlowFabric's create seeds it);
//   - total_attempt_count, current_attempt_id with current_attempt_index,
//     and current_waitpoint_id must parse when present and non-empty.
//
// It returns nil, nil when the row is missing.
func DescribeExecution(ctx context.Context, db DB, partition int16, executionID string) (*ExecutionSnapshot, error) {
	k, err := parseExec("describe_execution", partition, executionID)
	if err != nil {
		return nil, err
	}
	var (
		flowID      *string
		lane        string
		publicState string
		blocking    *string
		createdAt   int64
		rawFields   []byte
	)
	err = db.QueryRow(ctx, `
        SELECT flow_id, lane_id, public_state, blocking_reason,
               created_at_ms, raw_fields
        FROM ff_exec_core
        WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id).Scan(&flowID, &lane, &publicState, &blocking, &createdAt, &rawFields)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, dbErr("describe_execution", k, err)
	}
	raw := rawFieldStrings(rawFields)

	// parse_public_state: raw, no normalisation.
	ps, msg := serdeEnum(publicState, publicStates)
	if msg != "" {
		return nil, corruption("%s: public_state: '%s' is not a known public state: %s", describeCtx, publicState, msg)
	}
	if msg := laneIDError(lane); msg != "" {
		return nil, corruption("%s: lane_id: fails LaneId validation (key corruption?): %s", describeCtx, msg)
	}
	if flowID != nil {
		// The map holds "{fp:N}:<uuid>"; Uuid::parse_str stops at its first
		// character, '{', which is no hex digit (the string does not end in
		// '}', so it is not read as a braced UUID).
		return nil, corruption("%s: flow_id: is not a valid UUID (key corruption?): "+
			"invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-], found `{` at 1", describeCtx)
	}
	snap := &ExecutionSnapshot{
		Partition:   k.part,
		ExecutionID: k.id,
		LaneID:      lane,
		Namespace:   raw["namespace"],
		PublicState: ps,
		CreatedAtMs: createdAt,
		Tags:        rawTags(rawFields),
	}
	if blocking != nil {
		snap.BlockingReason = *blocking
	}
	snap.BlockingDetail = raw["blocking_detail"]
	lm := raw["last_mutation_at"]
	if lm == "" {
		return nil, corruption("%s: last_mutation_at: is missing or empty (key corruption?)", describeCtx)
	}
	if snap.LastMutationAtMs, err = parseRustInt(lm, 64, true); err != nil {
		return nil, corruption("%s: last_mutation_at: is not a valid ms timestamp ('%s'): %v", describeCtx, lm, err)
	}
	if s := raw["total_attempt_count"]; s != "" {
		n, err := parseRustInt(s, 32, false)
		if err != nil {
			return nil, corruption("%s: total_attempt_count: is not a valid u32 ('%s'): %v", describeCtx, s, err)
		}
		snap.TotalAttemptCount = uint32(n)
	}
	if id := raw["current_attempt_id"]; id != "" {
		if _, err := uuid.Parse(id); err != nil {
			return nil, corruption("%s: current_attempt_id: is not a valid UUID: %v", describeCtx, err)
		}
		s := raw["current_attempt_index"]
		if s == "" {
			return nil, corruption("%s: current_attempt_index: is missing while current_attempt_id is set (key corruption?)", describeCtx)
		}
		n, err := parseRustInt(s, 32, false)
		if err != nil {
			return nil, corruption("%s: current_attempt_index: is not a valid u32 ('%s'): %v", describeCtx, s, err)
		}
		snap.CurrentAttempt = &AttemptSummary{AttemptID: id, AttemptIndex: uint32(n)}
	}
	if wp := raw["current_waitpoint_id"]; wp != "" {
		if _, err := uuid.Parse(wp); err != nil {
			return nil, corruption("%s: current_waitpoint_id: is not a valid UUID (key corruption?): %v", describeCtx, err)
		}
		snap.CurrentWaitpointID = wp
	}
	return snap, nil
}

// laneIDError is LaneId::validate (ff-core/src/types.rs:479-493): the
// LaneIdError text, or "" for a valid lane.
func laneIDError(s string) string {
	if s == "" {
		return "lane_id is empty"
	}
	if len(s) > 64 {
		return "lane_id exceeds 64 bytes (got " + strconv.Itoa(len(s)) + ")"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return "lane_id contains non-ASCII-printable byte at index " + strconv.Itoa(i)
		}
	}
	return ""
}

// rawTags is describe_execution_impl's tag map: raw_fields.tags' members
// that are JSON strings.
func rawTags(rawFields []byte) map[string]string {
	var obj map[string]json.RawMessage
	if !isJSONObject(rawFields) || json.Unmarshal(rawFields, &obj) != nil || !isJSONObject(obj["tags"]) {
		return map[string]string{}
	}
	return rawFieldStrings(obj["tags"])
}

// parseRustInt parses s as Rust's str::parse::<i64> (signed) or ::<u32>
// does: an optional '+' (or '-' when signed) then ASCII digits only, with
// Rust's ParseIntError text.
func parseRustInt(s string, bits int, signed bool) (int64, error) {
	digits := s
	neg := false
	if strings.HasPrefix(digits, "+") || (signed && strings.HasPrefix(digits, "-")) {
		neg = digits[0] == '-'
		digits = digits[1:]
	}
	if digits == "" {
		return 0, errors.New("invalid digit found in string")
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, errors.New("invalid digit found in string")
		}
	}
	if signed {
		n, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			if neg {
				return 0, errors.New("number too small to fit in target type")
			}
			return 0, errors.New("number too large to fit in target type")
		}
		return n, nil
	}
	n, err := strconv.ParseUint(digits, 10, bits)
	if err != nil {
		return 0, errors.New("number too large to fit in target type")
	}
	return int64(n), nil
}

// Cancel is the Handle cancel, cancel_impl (exec_core.rs:524-637), one READ
// COMMITTED transaction that locks the execution (FOR UPDATE):
//   - a missing row is an InvalidInput error "cancel: execution_id=…: row
//     not found on partition_key=N";
//   - lifecycle_phase 'terminal' changes nothing: nil when public_state is
//     'cancelled', else an InvalidInput error "cancel: execution_id=…:
//     already terminal in state '<public_state>'". Only 'terminal' counts:
//     a row the operator or flow cancel left in lifecycle 'cancelled' is
//     cancelled again (re-stamped terminal, by the worker);
//   - otherwise the row becomes terminal/unowned/not_applicable, public and
//     attempt state 'cancelled', terminal_at_ms now, cancellation_reason
//     reason, cancelled_by 'worker', raw_fields.last_mutation_at now (as a
//     string), and the current attempt's outcome is cleared (#355), so
//     read_execution_info then derives terminal_outcome none, not
//     cancelled. The attempt's lease is left as it is and no lease event
//     is written: despite its doc comment, cancel_impl checks no lease.
func Cancel(ctx context.Context, db TxDB, partition int16, executionID, reason string) error {
	k, err := parseExec("cancel", partition, executionID)
	if err != nil {
		return err
	}
	now := nowMs()
	tx, err := db.Begin(ctx)
	if err != nil {
		return dbErr("cancel", k, err)
	}
	defer rollback(ctx, tx)

	var phase, publicState string
	err = tx.QueryRow(ctx, `
        SELECT lifecycle_phase, public_state
        FROM ff_exec_core
        WHERE partition_key = $1 AND execution_id = $2
        FOR UPDATE
        `, k.part, k.id).Scan(&phase, &publicState)
	if errors.Is(err, pgx.ErrNoRows) {
		return invalidInput("cancel: execution_id=%s: row not found on partition_key=%d", k.wire, k.part)
	}
	if err != nil {
		return dbErr("cancel", k, err)
	}
	if phase == "terminal" {
		if publicState == "cancelled" {
			return nil
		}
		return invalidInput("cancel: execution_id=%s: already terminal in state '%s'", k.wire, publicState)
	}

	// FlowFabric's to_jsonb($3::text): sqlx declares $3 an int8, so its
	// ::text is a cast; left to inference, ::text would declare $3 text,
	// against terminal_at_ms = $3. $3::bigint::text is FlowFabric's reading.
	if _, err := tx.Exec(ctx, `
        UPDATE ff_exec_core
        SET lifecycle_phase     = 'terminal',
            ownership_state     = 'unowned',
            eligibility_state   = 'not_applicable',
            public_state        = 'cancelled',
            attempt_state       = 'cancelled',
            terminal_at_ms      = $3,
            cancellation_reason = $4,
            cancelled_by        = 'worker',
            raw_fields          = jsonb_set(raw_fields, '{last_mutation_at}', to_jsonb($3::bigint::text))
        WHERE partition_key = $1 AND execution_id = $2
        `, k.part, k.id, now, reason); err != nil {
		return dbErr("cancel: update ff_exec_core", k, err)
	}
	if _, err := tx.Exec(ctx, `
        UPDATE ff_attempt
           SET outcome = NULL
         WHERE partition_key = $1
           AND execution_id  = $2
           AND attempt_index = (SELECT attempt_index FROM ff_exec_core
                                 WHERE partition_key = $1 AND execution_id = $2)
        `, k.part, k.id); err != nil {
		return dbErr("cancel: clear ff_attempt outcome", k, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return dbErr("cancel: commit", k, err)
	}
	return nil
}
