package grpclimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/enforce"
	"github.com/tollgate/tollgate/grpclimit"
	"github.com/tollgate/tollgate/memorystore"
)

// Keys that clients control, through a real gRPC server: a composite's
// parts cannot be re-split into someone else's tuple, and a long value's
// hash sent as a literal value does not spend the long value's counter.
func TestKeysCannotBeForged(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 4000)
	sum := sha256.Sum256([]byte(long))
	h := hex.EncodeToString(sum[:])
	p := strings.Repeat("p", 999)
	for _, tc := range []struct {
		name             string
		key              grpclimit.Key
		attacker, victim metadata.MD
	}{
		{"composite", grpclimit.Composite(grpclimit.Metadata("x-tenant"), grpclimit.Metadata("x-user")),
			metadata.Pairs("x-tenant", p+"008:abc", "x-user", "x"), metadata.Pairs("x-tenant", p, "x-user", "abc001:x")},
		{"composite, short", grpclimit.Composite(grpclimit.Metadata("x-tenant"), grpclimit.Metadata("x-user")),
			metadata.Pairs("x-tenant", "a1:b", "x-user", "c"), metadata.Pairs("x-tenant", "a", "x-user", "b1:c")},
		{"hashed", grpclimit.Metadata("x-api-key"), metadata.Pairs("x-api-key", "sha256="+h), metadata.Pairs("x-api-key", long)},
		{"hashed, bare hex", grpclimit.Metadata("x-api-key"), metadata.Pairs("x-api-key", h), metadata.Pairs("x-api-key", long)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := serve(t, mustNew(t, memorystore.New(), []grpclimit.Rule{{
				Name:     "r",
				Key:      tc.key,
				Policies: []enforce.Policy{{Name: "hourly", Limit: tollgate.PerHour(1)}},
			}}))
			var got []codes.Code
			for _, md := range []metadata.MD{tc.attacker, tc.victim, tc.victim} {
				_, err := check(context.Background(), c, md)
				got = append(got, status.Code(err))
			}
			if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("attacker, victim, victim again: %v, want %v", got, want)
			}
		})
	}
}
