package conformance_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/conformance"
)

// The oracle passes the hand-computed table every store must pass.
func TestModelConformance(t *testing.T) {
	conformance.Run(t, conformance.ModelBackend())
}
