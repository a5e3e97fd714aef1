package fleet

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flowfabric/ffreconcile/store"
)

// shape is what a configuration decides about the jobs of a River schema:
// which reconcilers tick and how often (River runs only the leader's
// periodic jobs), which rows their ticks and scans find (tenant filter,
// partition counts, batch size, lookahead) and which rows a row job may
// change (the filter again). Processes of one River schema must agree on
// it; settings of a process's own resources (pools, row workers, fetch
// timing, logging) may differ. It is stored as JSON in the heartbeat
// table, so its field names are a format: add fields, never rename them.
type shape struct {
	Reconcilers          map[string]string `json:"reconcilers"` // name → tick interval
	Namespace            string            `json:"namespace,omitempty"`
	InstanceTag          string            `json:"instance_tag,omitempty"` // KEY=VALUE
	BatchSize            int               `json:"batch_size"`
	PartitionCount       int               `json:"partition_count"`
	BudgetPartitionCount int               `json:"budget_partition_count"`
	Lookahead            string            `json:"lookahead"`
	// Settings are the running reconcilers' settings, by their ShapeKey,
	// stored beside the fields above (as "retention": "24h0m0s"; Off reads
	// "0s"): a setting of a reconciler not run is no concern of the
	// schema's other processes.
	Settings map[string]string `json:"-"`
}

// shape returns c's shape; c has its defaults applied.
func (c Config) shape() shape {
	s := shape{
		Reconcilers:          map[string]string{},
		Namespace:            c.Filter.Namespace,
		BatchSize:            c.BatchSize,
		PartitionCount:       c.PartitionCount,
		BudgetPartitionCount: c.BudgetPartitionCount,
		Lookahead:            c.Lookahead.String(),
		Settings:             map[string]string{},
	}
	if c.Filter.TagKey != "" {
		s.InstanceTag = c.Filter.TagKey + "=" + c.Filter.TagValue
	}
	for _, r := range c.running() {
		s.Reconcilers[r.Name] = c.Reconcilers[r.Name].String()
		for _, st := range r.Settings {
			s.Settings[st.ShapeKey] = max(c.Settings.Get(st), 0).String()
		}
	}
	return s
}

// MarshalJSON stores the settings beside the other fields.
func (s shape) MarshalJSON() ([]byte, error) {
	type plain shape
	b, err := json.Marshal(plain(s))
	if err != nil || len(s.Settings) == 0 {
		return b, err
	}
	var all map[string]any
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	for k, v := range s.Settings {
		all[k] = v
	}
	return json.Marshal(all)
}

// UnmarshalJSON reads the settings back: every top-level string that is
// not a field above.
func (s *shape) UnmarshalJSON(b []byte) error {
	type plain shape
	if err := json.Unmarshal(b, (*plain)(s)); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	s.Settings = map[string]string{}
	for _, f := range []string{"reconcilers", "namespace", "instance_tag", "batch_size", "partition_count", "budget_partition_count", "lookahead"} {
		delete(all, f)
	}
	for k, raw := range all {
		var v string
		if json.Unmarshal(raw, &v) == nil {
			s.Settings[k] = v
		}
	}
	return nil
}

// shapeJSON is c's shape as the heartbeat table stores it (map keys sorted,
// so equal shapes are equal bytes).
func (c Config) shapeJSON() []byte {
	b, err := json.Marshal(c.shape())
	if err != nil {
		panic(err) // a struct of strings, ints and string maps always marshals
	}
	return b
}

// diff lists, in words, how other differs from s ("" when they agree).
func (s shape) diff(other shape) string {
	var out []string
	add := func(what, here, there string) {
		if here != there {
			out = append(out, fmt.Sprintf("%s %s here, %s there", what, orNone(here), orNone(there)))
		}
	}
	add("reconcilers", strings.Join(slices.Sorted(maps.Keys(s.Reconcilers)), ","),
		strings.Join(slices.Sorted(maps.Keys(other.Reconcilers)), ","))
	for _, name := range slices.Sorted(maps.Keys(s.Reconcilers)) {
		if there, ok := other.Reconcilers[name]; ok {
			add(name+" interval", s.Reconcilers[name], there)
		}
	}
	add("namespace", s.Namespace, other.Namespace)
	add("instance tag", s.InstanceTag, other.InstanceTag)
	add("batch size", fmt.Sprint(s.BatchSize), fmt.Sprint(other.BatchSize))
	add("partition count", fmt.Sprint(s.PartitionCount), fmt.Sprint(other.PartitionCount))
	add("budget partition count", fmt.Sprint(s.BudgetPartitionCount), fmt.Sprint(other.BudgetPartitionCount))
	add("lookahead", s.Lookahead, other.Lookahead)
	for _, k := range settingKeys(s.Settings, other.Settings) {
		add(strings.ReplaceAll(k, "_", " "), s.Settings[k], other.Settings[k])
	}
	return strings.Join(out, "; ")
}

// settingKeys returns the keys of both, sorted.
func settingKeys(a, b map[string]string) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// ConfigMismatchError says that a process's configuration differs from a
// live process's of the same River schema: Start refuses to run it.
type ConfigMismatchError struct {
	Schema string
	// Other is the live process whose configuration differs.
	Other store.WorkerHeartbeat
	// Diff says how, e.g. "reconcilers lease_expiry here, delayed_promotion there".
	Diff string
}

func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("configuration differs from live process %s (host %s, pid %d, seen %s ago) of River schema %q: %s; "+
		"processes of one River schema must be configured alike: give this one the same settings, or run it as a fleet of its own "+
		"with --river-schema NAME (after `worker migrate --river-schema NAME`); to change a running fleet's settings, see docs/deployment.md",
		e.Other.ClientID, e.Other.Hostname, e.Other.PID, e.Other.Age.Round(time.Second), e.Schema, e.Diff)
}

// acceptLive returns the check Register runs on the schema's live
// processes: the first whose configuration differs refuses the start. A
// process that records no configuration (a version before it did) is taken
// to agree, so that a rolling upgrade to this version can start.
func (c Config) acceptLive(live []store.WorkerHeartbeat) error {
	mine := c.shape()
	for _, w := range live {
		if w.Config == nil {
			c.Logger.Warn("a live process of this River schema does not record its configuration (an earlier version); assuming it matches",
				"client_id", w.ClientID, "hostname", w.Hostname, "pid", w.PID)
			continue
		}
		var theirs shape
		if err := json.Unmarshal(w.Config, &theirs); err != nil {
			return fmt.Errorf("read configuration of live process %s: %w", w.ClientID, err)
		}
		if d := mine.diff(theirs); d != "" {
			return &ConfigMismatchError{Schema: c.RiverSchema, Other: w, Diff: d}
		}
	}
	return nil
}
