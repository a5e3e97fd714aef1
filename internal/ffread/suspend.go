package ffread

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"sort"
	"strconv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Signal is the part of ff-core's DeliverSignalArgs that deliver_signal
// stores in the suspension's member_map.
type Signal struct {
	// ID is the signal id, a UUID; "" mints a fresh one.
	ID             string
	Name           string
	Category       string
	SourceType     string
	SourceIdentity string
	// CorrelationID is stored as "" when empty (FlowFabric's
	// unwrap_or_default of None).
	CorrelationID string
	// Payload is stored hex-encoded; nil stores payload_hex null.
	Payload []byte
}

// signalBlob is the JSON object deliver_signal_impl appends to
// member_map[waitpoint_key] (suspend_ops.rs:845-855).
type signalBlob struct {
	SignalID       string  `json:"signal_id"`
	SignalName     string  `json:"signal_name"`
	SignalCategory string  `json:"signal_category"`
	SourceType     string  `json:"source_type"`
	SourceIdentity string  `json:"source_identity"`
	CorrelationID  string  `json:"correlation_id"`
	AcceptedAt     int64   `json:"accepted_at"`
	PayloadHex     *string `json:"payload_hex"`
}

// DeliverSignalSatisfied makes the writes deliver_signal_impl
// (suspend_ops.rs:765-969) makes when a signal satisfies the suspension's
// resume condition, in one SERIALIZABLE transaction retried up to three
// times on a serialization failure or deadlock (run_serializable,
// l.230-263), then ErrRetryExhausted:
//   - it locks the execution's ff_suspension_current row (none is a
//     NotFoundError{"suspension"});
//   - it appends the signal to member_map[waitpointKey], an array it
//     creates when missing. A member_map that is not an object, or an
//     entry that is not an array, is a Corruption error ("member_map not
//     a JSON object", "member_map[wp_key] not a JSON array");
//   - it sets ff_exec_core public_state 'resumable', lifecycle_phase
//     'runnable', eligibility_state 'eligible_now' (nothing else: the
//     ownership, attempt state and blocking reason the suspend left stay,
//     and there is no state guard: a missing row is not an error);
//   - it deletes every ff_waitpoint_pending row of the execution;
//   - it inserts a 'resumable' ff_completion_event at nowMs (no flow id,
//     namespace or instance tag).
//
// ff_suspension_current is left in place with its timeout_at_ms, as
// FlowFabric leaves it: only the typed resume_execution deletes it.
//
// What it skips, and why: the waitpoint lookup and its HMAC token checks
// (the caller names the waitpoint by its key), the evaluation of the
// resume condition (the caller asserts it is satisfied; FlowFabric would
// only append the signal otherwise) and the ff_signal_event outbox row
// (no reconciler reads it). It returns the signal id.
func DeliverSignalSatisfied(ctx context.Context, db TxDB, partition int16, executionID, waitpointKey string, sig Signal, nowMs int64) (string, error) {
	k, err := parseExec("deliver_signal", partition, executionID)
	if err != nil {
		return "", err
	}
	// FlowFabric's SignalId is a UUID by type; a malformed one would be
	// stored and then dropped by every reader.
	if sig.ID == "" {
		sig.ID = uuid.NewString()
	} else if _, err := uuid.Parse(sig.ID); err != nil {
		return "", invalidInput("deliver_signal: signal_id is not a UUID: %s", sig.ID)
	}
	blob := signalBlob{SignalID: sig.ID, SignalName: sig.Name, SignalCategory: sig.Category,
		SourceType: sig.SourceType, SourceIdentity: sig.SourceIdentity, CorrelationID: sig.CorrelationID,
		AcceptedAt: nowMs}
	if sig.Payload != nil {
		h := hex.EncodeToString(sig.Payload)
		blob.PayloadHex = &h
	}
	for range maxSerializableAttempts {
		err := deliverSignalOnce(ctx, db, k, waitpointKey, blob, nowMs)
		if err == nil {
			return sig.ID, nil
		}
		if !retryable(err) {
			return "", err
		}
	}
	return "", ErrRetryExhausted
}

func deliverSignalOnce(ctx context.Context, db TxDB, k execKey, waitpointKey string, blob signalBlob, nowMs int64) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return dbErr("deliver_signal", k, err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
		return dbErr("deliver_signal: set isolation", k, err)
	}

	var condition, memberMap []byte
	err = tx.QueryRow(ctx, "SELECT condition, member_map FROM ff_suspension_current "+
		"WHERE partition_key = $1 AND execution_id = $2 "+
		"FOR UPDATE", k.part, k.id).Scan(&condition, &memberMap)
	if errors.Is(err, pgx.ErrNoRows) {
		return &NotFoundError{Entity: "suspension"}
	}
	if err != nil {
		return dbErr("deliver_signal: lock ff_suspension_current", k, err)
	}

	updated, err := appendSignal(memberMap, waitpointKey, blob)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "UPDATE ff_suspension_current SET member_map = $1 "+
		"WHERE partition_key = $2 AND execution_id = $3", updated, k.part, k.id); err != nil {
		return dbErr("deliver_signal: update member_map", k, err)
	}
	if _, err := tx.Exec(ctx, "UPDATE ff_exec_core "+
		"SET public_state = 'resumable', "+
		"lifecycle_phase = 'runnable', "+
		"eligibility_state = 'eligible_now' "+
		"WHERE partition_key = $1 AND execution_id = $2", k.part, k.id); err != nil {
		return dbErr("deliver_signal: update ff_exec_core", k, err)
	}
	if _, err := tx.Exec(ctx, "DELETE FROM ff_waitpoint_pending "+
		"WHERE partition_key = $1 AND execution_id = $2", k.part, k.id); err != nil {
		return dbErr("deliver_signal: delete ff_waitpoint_pending", k, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO ff_completion_event "+
		"(partition_key, execution_id, outcome, occurred_at_ms) "+
		"VALUES ($1, $2, 'resumable', $3)", k.part, k.id, nowMs); err != nil {
		return dbErr("deliver_signal: insert ff_completion_event", k, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return dbErr("deliver_signal: commit", k, err)
	}
	return nil
}

// appendSignal is deliver_signal_impl's step 4 (suspend_ops.rs:845-869):
// member_map with blob appended to the array at key.
func appendSignal(memberMap []byte, key string, blob signalBlob) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if !isJSONObject(memberMap) || json.Unmarshal(memberMap, &obj) != nil {
		return nil, corruption("member_map not a JSON object")
	}
	entry, ok := obj[key]
	if !ok {
		entry = json.RawMessage("[]")
	}
	var arr []json.RawMessage
	if !isJSONArray(entry) || json.Unmarshal(entry, &arr) != nil {
		return nil, corruption("member_map[wp_key] not a JSON array")
	}
	b, err := json.Marshal(blob)
	if err != nil {
		return nil, err
	}
	if obj[key], err = json.Marshal(append(arr, b)); err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

// ClaimedResumed is what ClaimResumedExecution returns, from ff-core's
// ClaimedResumedExecution.
type ClaimedResumed struct {
	// LeaseID is the lease id written into the 'acquired' lease event;
	// FlowFabric's caller supplies it, ClaimResumedExecution mints one.
	LeaseID string
	// LeaseEpoch is the attempt's lease_epoch after the bump.
	LeaseEpoch       uint64
	AttemptIndex     uint32
	LeaseExpiresAtMs int64
}

// ClaimResumedExecution is claim_resumed_execution_impl
// (suspend_ops.rs:987-1123), one READ COMMITTED transaction. It locks the
// execution (FOR UPDATE): a missing row is a NotFoundError{"execution"}
// and public_state other than 'resumable' is ErrNotAResumedExecution. That
// is the only gate: lifecycle_phase is not read, so a row made terminal
// after a signal while keeping 'resumable' is claimed back to active. Then
// the current attempt gets the worker, lease_epoch + 1, lease expiry
// now + leaseTTLms, started_at_ms now and outcome NULL; the execution
// becomes active/leased/not_applicable, public_state 'running' (the bare
// literal, which read_* shows as active and describe rejects),
// attempt_state 'running_attempt', started_at_ms set if NULL; and an
// 'acquired' ff_lease_event is written with the lease id, namespace and
// instance tag. A missing attempt row is not caught by the gate: the
// attempt UPDATE changes nothing and the epoch read then fails.
func ClaimResumedExecution(ctx context.Context, db TxDB, partition int16, executionID, workerID, workerInstanceID string, leaseTTLms int64) (*ClaimedResumed, error) {
	k, err := parseExec("claim_resumed_execution", partition, executionID)
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, dbErr("claim_resumed_execution", k, err)
	}
	defer rollback(ctx, tx)

	var publicState string
	var attemptIndex int32
	err = tx.QueryRow(ctx, "SELECT public_state, attempt_index FROM ff_exec_core "+
		"WHERE partition_key = $1 AND execution_id = $2 "+
		"FOR UPDATE", k.part, k.id).Scan(&publicState, &attemptIndex)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{Entity: "execution"}
	}
	if err != nil {
		return nil, dbErr("claim_resumed_execution", k, err)
	}
	if publicState != "resumable" {
		return nil, ErrNotAResumedExecution
	}

	now := nowMs()
	// lease_ttl_ms is a u64 there; i64::try_from(..).unwrap_or(0) and a
	// saturating add.
	ttl := max(leaseTTLms, 0)
	expires := int64(math.MaxInt64)
	if now <= math.MaxInt64-ttl {
		expires = now + ttl
	}

	if _, err := tx.Exec(ctx, "UPDATE ff_attempt "+
		"SET worker_id = $1, worker_instance_id = $2, "+
		"lease_epoch = lease_epoch + 1, "+
		"lease_expires_at_ms = $3, started_at_ms = $4, outcome = NULL "+
		"WHERE partition_key = $5 AND execution_id = $6 AND attempt_index = $7",
		workerID, workerInstanceID, expires, now, k.part, k.id, attemptIndex); err != nil {
		return nil, dbErr("claim_resumed_execution: update ff_attempt", k, err)
	}
	if _, err := tx.Exec(ctx, "UPDATE ff_exec_core "+
		"SET lifecycle_phase = 'active', ownership_state = 'leased', "+
		"eligibility_state = 'not_applicable', "+
		"public_state = 'running', attempt_state = 'running_attempt', "+
		"started_at_ms = COALESCE(started_at_ms, $3) "+
		"WHERE partition_key = $1 AND execution_id = $2", k.part, k.id, now); err != nil {
		return nil, dbErr("claim_resumed_execution: update ff_exec_core", k, err)
	}
	var epoch int64
	if err := tx.QueryRow(ctx, "SELECT lease_epoch FROM ff_attempt "+
		"WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3",
		k.part, k.id, attemptIndex).Scan(&epoch); err != nil {
		return nil, dbErr("claim_resumed_execution: read lease_epoch", k, err)
	}
	leaseID := uuid.NewString()
	if err := emitLeaseEvent(ctx, tx, k, &leaseID, leaseEventAcquired, now); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, dbErr("claim_resumed_execution: commit", k, err)
	}
	return &ClaimedResumed{LeaseID: leaseID, LeaseEpoch: uint64(max(epoch, 0)),
		AttemptIndex: uint32(max(attemptIndex, 0)), LeaseExpiresAtMs: expires}, nil
}

// ResumeSignal is ff-core's ResumeSignal as observe_signals returns it.
type ResumeSignal struct {
	// WaitpointKey is the member_map key the signal was stored under (ours:
	// FlowFabric's ResumeSignal does not carry it).
	WaitpointKey   string
	SignalID       string
	SignalName     string
	SignalCategory string
	SourceType     string
	SourceIdentity string
	CorrelationID  string
	AcceptedAtMs   int64
	// Payload is payload_hex decoded; nil when absent or not valid hex.
	Payload []byte
}

// ObserveSignals is observe_signals_impl (suspend_ops.rs:1127-1160) with
// resume_signal_from_json (l.971-983): the signals in the execution's
// member_map, by waitpoint key in byte order (serde_json's map is a
// BTreeMap), each key's array in order. An entry is kept only when its
// signal_id is a string that parses as a UUID and its signal_name is a
// string, so the {signal_name: "timeout"} entry FlowFabric's
// suspension-timeout auto-resume appends under "__timeout__" (which has no
// signal_id) is never observed. A missing suspension, a member_map that
// is not an object and entries that are not arrays give no signals.
func ObserveSignals(ctx context.Context, db DB, partition int16, executionID string) ([]ResumeSignal, error) {
	k, err := parseExec("observe_signals", partition, executionID)
	if err != nil {
		return nil, err
	}
	var memberMap []byte
	err = db.QueryRow(ctx, "SELECT member_map FROM ff_suspension_current "+
		"WHERE partition_key = $1 AND execution_id = $2", k.part, k.id).Scan(&memberMap)
	if errors.Is(err, pgx.ErrNoRows) {
		return []ResumeSignal{}, nil
	}
	if err != nil {
		return nil, dbErr("observe_signals", k, err)
	}
	out := []ResumeSignal{}
	var obj map[string]json.RawMessage
	if !isJSONObject(memberMap) || json.Unmarshal(memberMap, &obj) != nil {
		return out, nil
	}
	keys := make([]string, 0, len(obj))
	for key := range obj {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		var arr []json.RawMessage
		if !isJSONArray(obj[key]) || json.Unmarshal(obj[key], &arr) != nil {
			continue
		}
		for _, v := range arr {
			if s, ok := resumeSignalFromJSON(v); ok {
				s.WaitpointKey = key
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// resumeSignalFromJSON is resume_signal_from_json (suspend_ops.rs:971-983).
func resumeSignalFromJSON(v json.RawMessage) (ResumeSignal, bool) {
	var fields map[string]json.RawMessage
	if !isJSONObject(v) || json.Unmarshal(v, &fields) != nil {
		return ResumeSignal{}, false
	}
	str := func(name string) (string, bool) {
		var s string
		if !isJSONString(fields[name]) || json.Unmarshal(fields[name], &s) != nil {
			return "", false
		}
		return s, true
	}
	id, ok := str("signal_id")
	if !ok {
		return ResumeSignal{}, false
	}
	if _, err := uuid.Parse(id); err != nil {
		return ResumeSignal{}, false
	}
	name, ok := str("signal_name")
	if !ok {
		return ResumeSignal{}, false
	}
	s := ResumeSignal{SignalID: id, SignalName: name}
	s.SignalCategory, _ = str("signal_category")
	s.SourceType, _ = str("source_type")
	s.SourceIdentity, _ = str("source_identity")
	s.CorrelationID, _ = str("correlation_id")
	// as_i64(): an integer that fits (not 1.5, not 1e3), else 0.
	if n, err := strconv.ParseInt(string(fields["accepted_at"]), 10, 64); err == nil {
		s.AcceptedAtMs = n
	}
	if h, ok := str("payload_hex"); ok {
		if b, err := hex.DecodeString(h); err == nil {
			s.Payload = b
		}
	}
	return s, true
}
