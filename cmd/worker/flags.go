package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/workers"
)

// flagSet wraps flag.FlagSet so that every flag has an environment variable,
// `--help` lists both with the default, and a bad environment value is
// reported with the variable's name. Flags given on the command line win over
// the environment.
type flagSet struct {
	fs      *flag.FlagSet
	name    string
	summary string
	entries []flagEntry
	set     map[string]bool // flags given, on the command line or in the environment
}

type flagEntry struct {
	name, env, help, def string
	secret               bool // never print the current value (passwords)
}

func newFlagSet(name, summary string) *flagSet {
	f := &flagSet{fs: flag.NewFlagSet(name, flag.ContinueOnError), name: name, summary: summary, set: map[string]bool{}}
	f.fs.SetOutput(io.Discard)
	return f
}

func (f *flagSet) add(name, env, def, help string, secret bool, v flag.Value) {
	f.fs.Var(v, name, help)
	f.entries = append(f.entries, flagEntry{name: name, env: env, help: help, def: def, secret: secret})
}

// String defines a string flag.
func (f *flagSet) String(p *string, name, env, def, help string) {
	*p = def
	f.add(name, env, def, help, false, (*stringValue)(p))
}

// Secret defines a string flag whose value is never printed.
func (f *flagSet) Secret(p *string, name, env, help string) {
	f.add(name, env, "", help, true, (*stringValue)(p))
}

// Int defines an int flag.
func (f *flagSet) Int(p *int, name, env string, def int, help string) {
	*p = def
	f.add(name, env, strconv.Itoa(def), help, false, (*intValue)(p))
}

// IntAuto defines an int flag whose zero value lets the program choose;
// defText says what it chooses.
func (f *flagSet) IntAuto(p *int, name, env, defText, help string) {
	*p = 0
	f.add(name, env, defText, help, false, (*intValue)(p))
}

// Bool defines a bool flag.
func (f *flagSet) Bool(p *bool, name, env string, def bool, help string) {
	*p = def
	f.add(name, env, strconv.FormatBool(def), help, false, (*boolValue)(p))
}

// Duration defines a duration flag.
func (f *flagSet) Duration(p *time.Duration, name, env string, def time.Duration, help string) {
	*p = def
	f.add(name, env, def.String(), help, false, (*durationValue)(p))
}

// DurationText defines a duration flag whose default is zero, shown in
// --help as defText: "0 (off)", or what the program chooses when the flag
// is not given (see isSet).
func (f *flagSet) DurationText(p *time.Duration, name, env, defText, help string) {
	*p = 0
	f.add(name, env, defText, help, false, (*durationValue)(p))
}

// settings defines a flag for each of a Config's settings (fleet.Flag),
// with the command line's convention: an unset flag leaves its setting at
// zero, which the program takes as the default --help shows; 0 turns off a
// setting that can be off (workers.Off) and is refused for the others, as
// are negative numbers.
func (f *flagSet) settings(flags []fleet.Flag) {
	for _, s := range flags {
		env := "FF_" + strings.ToUpper(strings.ReplaceAll(s.Flag, "-", "_"))
		if s.Flag == "database-url" {
			env = "DATABASE_URL"
		}
		var v flag.Value
		switch p := s.Value.(type) {
		case *int:
			v = (*positiveInt)(p)
			if s.CanBeOff {
				v = &offInt{p: p}
			}
		case *time.Duration:
			v = &cliDuration{set: func(d time.Duration) { *p = d }, canBeOff: s.CanBeOff}
		case interface{ SetDuration(time.Duration) }:
			v = &cliDuration{set: p.SetDuration, canBeOff: s.CanBeOff}
		case *string:
			v = (*stringValue)(p)
		case *bool:
			v = (*boolValue)(p)
		case flag.Value:
			v = p
		default:
			panic(fmt.Sprintf("flag --%s: no command-line form for %T", s.Flag, s.Value))
		}
		f.add(s.Flag, env, s.Default, s.Help, s.Secret, v)
	}
}

// positiveDuration defines a duration flag that must be positive when
// given; unset, *p stays zero (the default, defText in --help).
func (f *flagSet) positiveDuration(p *time.Duration, name, defText, help string) {
	env := "FF_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	f.add(name, env, defText, help, false, &cliDuration{set: func(d time.Duration) { *p = d }})
}

// isSet reports whether the flag was given, on the command line or in its
// environment variable.
func (f *flagSet) isSet(name string) bool { return f.set[name] }

// Strings defines a repeatable string flag; its environment variable takes a
// comma-separated list.
func (f *flagSet) Strings(p *[]string, name, env, help string) {
	f.add(name, env, "", help, false, (*stringsValue)(p))
}

// errHelp is returned by parse when --help was asked for; the usage has been
// printed and the command should exit 0.
var errHelp = errors.New("help requested")

// parse applies environment variables, then the command line.
func (f *flagSet) parse(args []string, stdout io.Writer) error {
	for _, e := range f.entries {
		v, ok := os.LookupEnv(e.env)
		if !ok || v == "" {
			continue
		}
		fl := f.fs.Lookup(e.name)
		if sv, isList := fl.Value.(*stringsValue); isList {
			*sv = nil
			_ = sv.Set(v)
			continue
		}
		if err := fl.Value.Set(v); err != nil {
			return badUsage("--%s %s (environment variable %s): %v", e.name, v, e.env, err)
		}
		f.set[e.name] = true
	}
	// Values set from the environment are defaults for a repeatable flag:
	// the first command-line occurrence replaces them instead of appending.
	for _, e := range f.entries {
		if sv, ok := f.fs.Lookup(e.name).Value.(*stringsValue); ok && len(*sv) > 0 {
			f.fs.Lookup(e.name).Value = &resettingStrings{target: sv}
		}
	}
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(stdout)
			return errHelp
		}
		return badUsage("%s (see `worker %s --help`)", twoDashes(err), f.name)
	}
	f.fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.fs.NArg() > 0 {
		return badUsage("unexpected argument %q (see `worker %s --help`)", f.fs.Arg(0), f.name)
	}
	return nil
}

// usage prints the summary and a table of flags, environment variables and
// defaults. Secret flags show no value.
func (f *flagSet) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: worker %s [flags]\n\n%s\n\nFlags (each also read from its environment variable; flags win):\n", f.name, f.summary)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, e := range f.entries {
		def := ""
		if e.def != "" && e.def != "false" {
			def = " (default " + e.def + ")"
		}
		fmt.Fprintf(tw, "  --%s\t%s\t%s%s\n", e.name, e.env, e.help, def)
	}
	// The logging flags, read before the command's, in the same columns.
	fmt.Fprint(tw, logFlagsHelp)
	tw.Flush()
}

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }

type intValue int

func (i *intValue) Set(v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("%q is not a whole number", v)
	}
	*i = intValue(n)
	return nil
}
func (i *intValue) String() string { return strconv.Itoa(int(*i)) }

type boolValue bool

func (b *boolValue) Set(v string) error {
	x, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("%q is not true or false", v)
	}
	*b = boolValue(x)
	return nil
}
func (b *boolValue) String() string   { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) IsBoolFlag() bool { return true }

// positiveInt is a count given on the command line: at least 1 (unset, it
// is zero, the program's default).
type positiveInt int

// parseCount reads a whole number given on the command line.
func parseCount(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number", v)
	}
	return n, nil
}

func (i *positiveInt) Set(v string) error {
	n, err := parseCount(v)
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("must be at least 1 (leave the flag out for its default)")
	}
	*i = positiveInt(n)
	return nil
}
func (i *positiveInt) String() string {
	if i == nil {
		return "0"
	}
	return strconv.Itoa(int(*i))
}

// offInt is a count that can be off: 0 on the command line is the
// config's -1 (off), as a duration's 0 is workers.Off.
type offInt struct{ p *int }

func (i *offInt) Set(v string) error {
	n, err := parseCount(v)
	if err != nil {
		return err
	}
	if n < 0 {
		return errors.New("must not be negative (0 turns it off)")
	}
	*i.p = n
	if n == 0 {
		*i.p = -1
	}
	return nil
}
func (i *offInt) String() string {
	if i == nil || i.p == nil {
		return "0"
	}
	return strconv.Itoa(max(*i.p, 0))
}

// cliDuration is a duration given on the command line: positive, or 0 to
// turn off a setting that can be off (workers.Off).
type cliDuration struct {
	set      func(time.Duration)
	canBeOff bool
	given    time.Duration
}

func (d *cliDuration) Set(v string) error {
	x, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("%q is not a duration (examples: 500ms, 1.5s, 2m)", v)
	}
	switch {
	case x < 0 && d.canBeOff:
		return errors.New("must not be negative (0 turns it off)")
	case x < 0:
		return errors.New("must be positive")
	case x == 0 && d.canBeOff:
		d.given = 0
		d.set(workers.Off)
		return nil
	case x == 0:
		return errors.New("must be positive (leave the flag out for its default)")
	}
	d.given = x
	d.set(x)
	return nil
}
func (d *cliDuration) String() string {
	if d == nil {
		return "0s"
	}
	return d.given.String()
}

type durationValue time.Duration

func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("%q is not a duration (examples: 500ms, 1.5s, 2m)", v)
	}
	*d = durationValue(x)
	return nil
}
func (d *durationValue) String() string { return time.Duration(*d).String() }

// stringsValue is a list flag: each occurrence adds its comma-separated
// items, trimmed, empty ones dropped.
type stringsValue []string

func (s *stringsValue) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*s = append(*s, part)
		}
	}
	return nil
}
func (s *stringsValue) String() string { return strings.Join(*s, ",") }

// resettingStrings drops environment-provided values on the first flag.
type resettingStrings struct {
	target *stringsValue
	set    bool
}

func (r *resettingStrings) Set(v string) error {
	if !r.set {
		*r.target = nil
		r.set = true
	}
	return r.target.Set(v)
}
func (r *resettingStrings) String() string {
	if r.target == nil {
		return ""
	}
	return r.target.String()
}

// databaseURLFlag registers --database-url / DATABASE_URL, shared by every
// subcommand.
func databaseURLFlag(f *flagSet, p *string) {
	f.Secret(p, "database-url", "DATABASE_URL",
		"PostgreSQL connection string (URL or key=value); its password is never logged (default "+dbconn.DefaultURL+")")
}

// badValueRE matches the flag package's error for a value its flag refused.
var badValueRE = regexp.MustCompile(`^invalid value "(.*)" for flag -(\S+): (.*)$`)

// twoDashes words the flag package's parse errors, which name a flag with
// one dash ("invalid value … for flag -lease-expiry-interval"), with the two
// dashes --help and the README use; a refused value reads as the other
// settings' errors do: "--flag value: problem".
func twoDashes(err error) string {
	msg := err.Error()
	if m := badValueRE.FindStringSubmatch(msg); m != nil {
		return "--" + m[2] + " " + m[1] + ": " + m[3]
	}
	for _, p := range []string{"not defined: -", "for flag -", "needs an argument: -", "for -"} {
		msg = strings.Replace(msg, p, p+"-", 1)
	}
	return msg
}
