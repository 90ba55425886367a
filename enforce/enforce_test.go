package enforce_test

import (
	"testing"

	"github.com/tollgate/tollgate/enforce"
)

func TestParseFailureMode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]enforce.FailureMode{"fail_open": enforce.FailOpen, "Fail-Closed": enforce.FailClosed, "closed": enforce.FailClosed} {
		if got, err := enforce.ParseFailureMode(in); err != nil || got != want {
			t.Errorf("ParseFailureMode(%q) = %v, %v", in, got, err)
		}
		if got, _ := enforce.ParseFailureMode(want.String()); got != want {
			t.Errorf("%v does not round-trip", want)
		}
	}
	if _, err := enforce.ParseFailureMode("maybe"); err == nil {
		t.Error("accepted maybe")
	}
}
