package ffread

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// The serde variants (snake_case) of ff-core's state enums
// (ff-core/src/state.rs:9-184), in declaration order, which is the order
// serde lists them in an "unknown variant" message.
var (
	lifecyclePhases   = []string{"submitted", "runnable", "active", "suspended", "terminal"}
	ownershipStates   = []string{"unowned", "leased", "lease_expired_reclaimable", "lease_revoked"}
	eligibilityStates = []string{"eligible_now", "not_eligible_until_time", "blocked_by_dependencies",
		"blocked_by_budget", "blocked_by_quota", "blocked_by_route", "blocked_by_lane_state", "blocked_by_operator",
		"not_applicable"}
	blockingReasons = []string{"none", "waiting_for_worker", "waiting_for_retry_backoff", "waiting_for_resume_delay",
		"waiting_for_delay", "waiting_for_signal", "waiting_for_approval", "waiting_for_callback",
		"waiting_for_tool_result", "waiting_for_children", "waiting_for_budget", "waiting_for_quota",
		"waiting_for_capable_worker", "waiting_for_locality_match", "paused_by_operator", "paused_by_policy",
		"paused_by_flow_cancel"}
	attemptStates = []string{"none", "pending_first_attempt", "running_attempt", "attempt_interrupted",
		"pending_retry_attempt", "pending_replay_attempt", "attempt_terminal"}
	publicStates = []string{"waiting", "delayed", "rate_limited", "waiting_children", "active", "suspended",
		"resumable", "completed", "failed", "cancelled", "expired", "skipped"}
)

// outcomeNone is TerminalOutcome::None.
const outcomeNone = "none"

// normaliseLifecyclePhase is normalise_lifecycle_phase (exec_core.rs:744-759):
// ff_exec_core's private literals to the nearest LifecyclePhase variant;
// anything else passes through for serdeEnum to reject.
func normaliseLifecyclePhase(raw string) string {
	switch raw {
	case "cancelled", "terminal":
		return "terminal"
	case "pending", "runnable", "eligible", "blocked":
		return "runnable"
	}
	return raw
}

// normaliseOwnershipState is normalise_ownership_state (exec_core.rs:761-771).
func normaliseOwnershipState(raw string) string {
	if raw == "released" {
		return "unowned"
	}
	return raw
}

// normaliseEligibilityState is normalise_eligibility_state
// (exec_core.rs:773-784).
func normaliseEligibilityState(raw string) string {
	switch raw {
	case "cancelled":
		return "not_applicable"
	case "pending_claim":
		return "eligible_now"
	}
	return raw
}

// normaliseAttemptState is normalise_attempt_state (exec_core.rs:786-800).
// 'terminal_failed' (claim_grant.rs:521) is not mapped there, so it is a
// Corruption error on read.
func normaliseAttemptState(raw string) string {
	switch raw {
	case "pending", "pending_claim":
		return "pending_first_attempt"
	case "running":
		return "running_attempt"
	case "cancelled":
		return "attempt_terminal"
	}
	return raw
}

// normalisePublicState is normalise_public_state (exec_core.rs:802-812): only
// the bare 'running' the claim paths write is mapped (to 'active').
func normalisePublicState(raw string) string {
	if raw == "running" {
		return "active"
	}
	return raw
}

// serdeEnum decodes raw as FlowFabric does a column literal: it wraps it
// in quotes and hands it to serde_json as a unit-variant enum
// (`format!("\"{}\"", raw)` then `serde_json::from_str`). So raw is read as
// the inside of a JSON string (escapes are decoded: `act\u0069ve` is
// active) and must then equal one of variants. It returns the variant, or
// serde_json's message: for an unknown variant serde's "unknown variant
// `x`, expected one of `a`, `b`, …" with serde_json's " at line 1 column N"
// (N the quoted length), exactly; for a literal that is not a valid JSON
// string body (a quote, a control character, a bad escape) Go's JSON
// message, which serde_json words differently.
func serdeEnum(raw string, variants []string) (string, string) {
	quoted := `"` + raw + `"`
	var s string
	if err := json.Unmarshal([]byte(quoted), &s); err != nil {
		return "", err.Error()
	}
	if !slices.Contains(variants, s) {
		return "", fmt.Sprintf("unknown variant `%s`, expected %s at line 1 column %d", s, oneOf(variants), len(quoted))
	}
	return s, ""
}

// oneOf is serde's OneOf display of the expected variants.
func oneOf(names []string) string {
	switch len(names) {
	case 0:
		return "there are no variants"
	case 1:
		return "`" + names[0] + "`"
	case 2:
		return "`" + names[0] + "` or `" + names[1] + "`"
	}
	return "one of `" + strings.Join(names, "`, `") + "`"
}

// jsonEnum is exec_core.rs's json_enum! macro (l.814-825): raw (already
// normalised) must be a variant, else a Corruption error
// "exec_core: <field>: '<raw>' is not a known value: <serde message>".
func jsonEnum(field, raw string, variants []string) (string, error) {
	v, msg := serdeEnum(raw, variants)
	if msg != "" {
		return "", corruption("exec_core: %s: '%s' is not a known value: %s", field, raw, msg)
	}
	return v, nil
}

// deriveTerminalOutcome is derive_terminal_outcome (exec_core.rs:827-849):
// the outcome is none unless the normalised phase is terminal; a raw
// 'cancelled' phase is cancelled whatever the attempt says; otherwise the
// current attempt's outcome decides, and any outcome but the five terminal
// ones (interrupted, attempt_interrupted, retry, NULL, no attempt row)
// gives none.
func deriveTerminalOutcome(phaseNorm, phaseRaw string, attemptOutcome *string) string {
	if phaseNorm != "terminal" {
		return outcomeNone
	}
	if phaseRaw == "cancelled" {
		return "cancelled"
	}
	if attemptOutcome != nil {
		switch *attemptOutcome {
		case "success", "failed", "cancelled", "expired", "skipped":
			return *attemptOutcome
		}
	}
	return outcomeNone
}
