package redisstore

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
)

// TestStateFunctionsOnce: each algorithm's state functions are defined in
// its own file only, and the settle's script and the function library
// each hold them exactly once — the settle's with the state functions of
// every algorithm, each inside the correction that uses it.
func TestStateFunctionsOnce(t *testing.T) {
	for _, a := range tollgate.Algorithms() {
		for _, fn := range []string{"_read(", "_write("} {
			def := "local function " + keyNames[a] + fn
			if n := strings.Count(sources[a], def); n != 1 {
				t.Errorf("%s's script defines %s… %d times, want once", a, def, n)
			}
			if n := strings.Count(settleSource, def); n != 1 {
				t.Errorf("the settle's script defines %s… %d times, want once", def, n)
			}
			if n := strings.Count(library, def); n != 1 {
				t.Errorf("the library defines %s… %d times, want once", def, n)
			}
		}
	}
	settle, err := luaFiles.ReadFile("lua/settle.lua")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(settle), "redis.call('HMGET'") || strings.Contains(string(settle), "redis.call('GET'") ||
		strings.Contains(string(settle), "redis.call('HSET'") || strings.Contains(string(settle), "redis.call('SET'") {
		t.Errorf("lua/settle.lua reads or writes a hash or a value itself, not with its algorithm's functions")
	}
}
