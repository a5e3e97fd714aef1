package workers

import (
	"fmt"
	"time"
)

// Setting is a duration a reconciler is configured with beyond its tick
// interval (retention's age, dependency's stale threshold), declared with
// the reconciler in its own file (Reconciler.Settings). Everything else
// walks the registry for it: `worker run` and `worker status` define its
// flag (--Flag, environment FF_<FLAG>), the fleet validates it and records
// it in its shape, and the reconciler's workers read it from
// Config.Settings.
//
// Its values follow River's convention: zero (unset) takes Default, and a
// setting that can be off is off at Off, its one way of saying so (0 on the
// command line).
type Setting struct {
	// Flag is its name on the command line, e.g. "retention".
	Flag string
	// Help says what it does, for --help.
	Help string
	// Default is the value an unset (zero) setting takes: Off for one that
	// is off unless asked for.
	Default time.Duration
	// CanBeOff: Off turns it off.
	CanBeOff bool
	// Min is the least value it takes when on; Max, when positive, the
	// most.
	Min, Max time.Duration
	// ShapeKey is its key in the configuration the processes of one River
	// schema must agree on (stored with each process's heartbeat: a
	// format, never renamed).
	ShapeKey string
}

// Off is the value of a Setting that is off (River's -1 for what it can
// turn off).
const Off time.Duration = -1

// Values are the settings of a fleet, by Setting. A setting absent (or
// zero) takes its default.
type Values map[*Setting]time.Duration

// Get returns s's value: its default when unset, Off when off.
func (v Values) Get(s *Setting) time.Duration {
	if d := v[s]; d != 0 {
		return d
	}
	return s.Default
}

// On reports whether s is on: its value is not Off.
func (v Values) On(s *Setting) bool { return v.Get(s) != Off }

// Validate returns what is wrong with d as s's value ("" when nothing):
// zero takes the default; Off only when s can be off; otherwise from Min
// to Max.
func (s *Setting) Validate(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d == Off && s.CanBeOff:
		return ""
	case d < 0:
		if s.CanBeOff {
			return "negative (Off, -1, turns it off)"
		}
		return "negative"
	case d < s.Min:
		return fmt.Sprintf("too short (minimum %s)", s.Min)
	case s.Max > 0 && d > s.Max:
		return fmt.Sprintf("too long (at most %s)", s.Max)
	}
	return ""
}

// DefaultText says, for --help, what an unset s takes.
func (s *Setting) DefaultText() string {
	if s.Default == Off {
		return "0: off"
	}
	return s.Default.String()
}

// settingsOf returns the settings of the reconcilers of rs, in order.
func settingsOf(rs []*Reconciler) []*Setting {
	var out []*Setting
	for _, r := range rs {
		out = append(out, r.Settings...)
	}
	return out
}

// AllSettings returns every reconciler's settings, in the registry's order.
func AllSettings() []*Setting { return settingsOf(registry) }
