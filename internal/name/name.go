// Package name is the one rule for the names leasehold stores: resources
// and holders of leases, a task's processor, kind, queue, unique key and
// lock, a schedule's name. The REST API, the library, the schedules and the
// command line all check a name here, so that each refuses what the others
// refuse, with the same words.
//
// A name is 1 to 255 bytes of UTF-8 in Unicode normalization form C, with
// no control characters (Cc) and no format characters (Cf: zero-width
// spaces, the bidirectional overrides that make a name read as another),
// and not blank. It is refused, not rewritten: a holder names its lease
// again in every renewal and release, a compare-and-set on the name it
// sent, so the name stored must be the name sent; "café" in NFC and in NFD
// would otherwise be two resources that look the same.
package name

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// MaxBytes is the longest name, in bytes.
const MaxBytes = 255

// ReservedPrefix begins the resources of leasehold's own leases (the
// reaper's, the scheduler's, the generator's, each replica's instance
// lease): no API or library client may acquire, renew or release one.
const ReservedPrefix = "leasehold:"

// Reserved reports whether resource is in the reserved namespace.
func Reserved(resource string) bool { return strings.HasPrefix(resource, ReservedPrefix) }

// Error is a name that breaks the rule: Field names it as the caller's
// caller knows it ("resource", "--kind"), Reason says what is wrong and
// how to put it right.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string { return e.Field + " " + e.Reason }

// Check returns an *Error when v breaks the rule, nil when it keeps it.
func Check(field, v string) error {
	bad := func(format string, args ...any) error {
		return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case v == "":
		return bad("is empty; give a name of 1 to %d bytes", MaxBytes)
	case len(v) > MaxBytes:
		return bad("is %d bytes long; the limit is %d bytes", len(v), MaxBytes)
	case !utf8.ValidString(v):
		return bad("is not valid UTF-8; send the name as UTF-8 text")
	}
	for _, r := range v {
		switch {
		case unicode.Is(unicode.Cc, r):
			return bad("%q contains the control character %U; use printable characters only", v, r)
		case unicode.Is(unicode.Cf, r):
			return bad("%q contains the invisible format character %U (a zero-width or bidirectional mark); remove it", v, r)
		}
	}
	if strings.TrimFunc(v, unicode.IsSpace) == "" {
		return bad("%q is only white space; give a name that can be read", v)
	}
	if !norm.NFC.IsNormalString(v) {
		return bad("%q is not in Unicode normalization form C; send its NFC form, %q", v, norm.NFC.String(v))
	}
	return nil
}
