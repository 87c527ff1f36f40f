package name

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"report:nightly", "café", "日本語", "a b", "x", strings.Repeat("a", MaxBytes), "leasehold:reaper"} {
		if err := Check("resource", ok); err != nil {
			t.Errorf("Check(%q): %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct{ v, says string }{
		{"", "is empty"},
		{strings.Repeat("a", MaxBytes+1), "is 256 bytes long"},
		{"\xff", "not valid UTF-8"},
		{"a\x00b", "control character U+0000"},
		{"a\u0085b", "control character U+0085"},
		{"admin\u202Etxt", "format character U+202E"},
		{"ad\u200Bmin", "format character U+200B"},
		{"   ", "only white space"},
		{"\u3000\u00a0", "only white space"},
		{"cafe\u0301", "normalization form C"},
	} {
		err := Check("resource", tc.v)
		var e *Error
		if !errors.As(err, &e) || e.Field != "resource" || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Check(%q): %v, want an *Error saying %q", tc.v, err, tc.says)
		}
	}
	if !Reserved("leasehold:reaper") || Reserved("leasehold") || Reserved("report:leasehold:x") {
		t.Error("Reserved: the namespace is the prefix leasehold:")
	}
}
