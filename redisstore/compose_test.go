package redisstore

import (
	"regexp"
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

// TestAllShapes: lua/all.lua's shapes give each decide the argument count
// of its file's run call and the cost where its header says it is; its
// decides table holds every algorithm's decide and the calendar's, once,
// in the script and in the library.
func TestAllShapes(t *testing.T) {
	all, err := luaFiles.ReadFile("lua/all.lua")
	if err != nil {
		t.Fatal(err)
	}
	shapeRe := regexp.MustCompile(`(\w+) = \{(\d+), (\d+)\}`)
	shapes := map[string][2]string{}
	for _, m := range shapeRe.FindAllStringSubmatch(string(all), -1) {
		shapes[m[1]] = [2]string{m[2], m[3]}
	}
	files := map[string]string{"cal": "calendar.lua"}
	for _, a := range tollgate.Algorithms() {
		files[keyNames[a]] = a.String() + ".lua"
	}
	if len(shapes) != len(files) {
		t.Errorf("all.lua has shapes for %d decides, want %d", len(shapes), len(files))
	}
	costRe := regexp.MustCompile(`(?m)^-- ARGV\[(\d+)\]\s+n: the cost`)
	for short, file := range files {
		body, err := luaFiles.ReadFile("lua/" + file)
		if err != nil {
			t.Fatal(err)
		}
		run := regexp.MustCompile(`run\(decide, (\d+), \d+, KEYS, ARGV\)`).FindStringSubmatch(string(body))
		cost := costRe.FindStringSubmatch(string(body))
		if run == nil || cost == nil {
			t.Fatalf("%s: no run call or no cost in its header", file)
		}
		if got, want := shapes[short], [2]string{run[1], cost[1]}; got != want {
			t.Errorf("all.lua's shape of %s is %v, want %v (its run call and header)", short, got, want)
		}
		entry := "decides['" + short + "'] = decide"
		for name, src := range map[string]string{"script": allSource, "library": library} {
			if n := strings.Count(src, entry); n != 1 {
				t.Errorf("the %s holds %q %d times, want once", name, entry, n)
			}
		}
	}
}
