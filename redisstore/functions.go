package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate"
)

// Redis 7 can keep Lua code as a function library (FUNCTION LOAD) whose
// functions are called with FCALL. The library holds the same code as the
// scripts — lib.lua once, then each algorithm's file and settle.lua — so a
// function decides (or settles) exactly as its script does. What differs
// is what a call costs:
// a script builds lib.lua's helpers and its decide function afresh on
// every call, a library once when it is loaded: 5,000 to 9,000
// instructions a decision less, by algorithm (bench/luacost.sh).
//
// The store calls functions only after Load has loaded the library on
// every server the client talks to (every master of a Cluster); until
// then, on Redis 6.2 (which has no functions), and on clients whose
// servers it cannot enumerate, it runs the scripts. A server that answers
// that it lacks the function (a restart that lost it, say) gets the script
// instead, and the store goes back to scripts until the next Load.
//
// An algorithm's file is its header (the comment up to the first blank
// line), its state functions — the only code that reads and writes the
// key's state, named after the algorithm (tb_read, tb_write, …) — and its
// decide, from the line "local function decide(" to the run call that
// ends it. settle.lua corrects every algorithm's state with those
// functions: each correction names the file it uses on a line
// "-- uses <file>: …". Its script (settleSource) is lib.lua and settle.lua
// with each such line followed by that file's state functions, so that a
// settle builds only its own algorithm's (a script builds every function
// it defines on every call). The library defines every algorithm's header
// and state functions once, at its top level, then each decide in a block
// of its own (they do not see each other) and settle.lua, where those
// lines stay comments.

var (
	// library is the source of the function library; libName its name,
	// which carries a hash of the source so that two versions of the store
	// can share a server; fnNames the function of each algorithm.
	library  string
	libName  string
	fnNames  [len(keyNames)]string
	settleFn string
	// allFn decides several limits together (lua/all.lua).
	allFn string
)

var (
	// runCall is the last line of each algorithm's file, which a script
	// runs and a function turns into its body.
	runCall = regexp.MustCompile(`(?m)^return (run\(decide, \d+, \d+), KEYS, ARGV\)\s*$`)
	// decideLine starts an algorithm's decide.
	decideLine = regexp.MustCompile(`(?m)^local function decide\(`)
	// usesLine names, in settle.lua, the file whose state functions a
	// correction uses.
	usesLine = regexp.MustCompile(`(?m)^[ \t]*-- uses ([a-z_]+\.lua): .*\n`)
)

// splitFile returns the part of an algorithm's file above its decide (its
// header and state functions), the state functions alone, and its decide.
func splitFile(file, body string) (above, state, decide string) {
	d := decideLine.FindStringIndex(body)
	h := strings.Index(body, "\n\n")
	if d == nil || h < 0 || h+2 > d[0] {
		panic("redisstore: lua/" + file + " has no header, state functions and decide") // embedded: cannot happen
	}
	return body[:d[0]], body[h+2 : d[0]], body[d[0]:]
}

// composeSettle returns settle.lua with each "-- uses <file>:" line
// followed by that file's state functions (bodies holds each algorithm's
// file).
func composeSettle(settle string, bodies [len(keyNames)]string) string {
	state := make(map[string]string, len(bodies))
	for _, a := range tollgate.Algorithms() {
		file := a.String() + ".lua"
		_, state[file], _ = splitFile(file, bodies[a])
	}
	used := make(map[string]bool, len(bodies))
	out := usesLine.ReplaceAllStringFunc(settle, func(line string) string {
		file := usesLine.FindStringSubmatch(line)[1]
		s, ok := state[file]
		if !ok || used[file] {
			panic("redisstore: lua/settle.lua uses " + file + " twice, or it is no algorithm's file") // embedded: cannot happen
		}
		used[file] = true
		return line + s
	})
	if len(used) != len(bodies) {
		panic("redisstore: lua/settle.lua does not use every algorithm's file") // embedded: cannot happen
	}
	return out
}

func initLibrary(lib string, bodies [len(keyNames)]string, settle, cal, all string) {
	h := sha1.New()
	h.Write([]byte(lib))
	for _, b := range bodies {
		h.Write([]byte(b))
	}
	h.Write([]byte(settle))
	h.Write([]byte(cal))
	h.Write([]byte(all))
	libName = "tollgate_" + hex.EncodeToString(h.Sum(nil))[:16]
	var b strings.Builder
	b.WriteString("#!lua name=" + libName + "\n")
	b.WriteString(lib)
	// Every algorithm's header and state functions, seen by its decide and
	// by settle.lua's corrections; then the decides, each in a block of its
	// own, registered as the algorithm's function and collected for
	// all.lua.
	writeDecides(&b, bodies, cal, func(short, run string) {
		for _, a := range tollgate.Algorithms() {
			if keyNames[a] == short {
				fnNames[a] = libName + "_" + short
				fmt.Fprintf(&b, "redis.register_function('%s', function(keys, argv) return %s, keys, argv) end)\n", fnNames[a], run)
			}
		}
		// The calendar's decide (cal) is asked only through all.lua.
	})
	settleFn = libName + "_settle"
	m := runCall.FindStringSubmatchIndex(settle)
	if m == nil {
		panic("redisstore: lua/settle.lua does not end with return run(...)") // embedded: cannot happen
	}
	b.WriteString("\ndo\n")
	b.WriteString(settle[:m[0]])
	fmt.Fprintf(&b, "redis.register_function('%s', function(keys, argv) return %s, keys, argv) end)\n", settleFn, settle[m[2]:m[3]])
	b.WriteString("end\n")
	allFn = libName + "_all"
	b.WriteString("\ndo\n")
	b.WriteString(strings.TrimSuffix(strings.TrimSpace(all), allCall))
	fmt.Fprintf(&b, "\nredis.register_function('%s', function(keys, argv) return all(keys, argv) end)\n", allFn)
	b.WriteString("end\n")
	library = b.String()
}

// allCall is the last line of lua/all.lua, which its script runs and its
// function replaces.
const allCall = "return all(KEYS, ARGV)"

// writeDecides writes, after lib.lua, every algorithm's header and state
// functions (and the calendar windows'), the table decides, and each
// decide in a block of its own (they do not see each other), which ends by
// putting it in decides under its short name (cal for the calendar's) and
// by calling end(short name, its run call without the keys and arguments)
// for what else the block holds.
func writeDecides(b *strings.Builder, bodies [len(keyNames)]string, cal string, end func(short, run string)) {
	files := make([]string, 0, len(bodies)+1)
	texts := make([]string, 0, len(bodies)+1)
	names := make([]string, 0, len(bodies)+1)
	for _, a := range tollgate.Algorithms() {
		files, texts, names = append(files, a.String()+".lua"), append(texts, bodies[a]), append(names, keyNames[a])
	}
	files, texts, names = append(files, "calendar.lua"), append(texts, cal), append(names, "cal")
	for i, f := range files {
		above, _, _ := splitFile(f, texts[i])
		b.WriteString("\n")
		b.WriteString(above)
	}
	b.WriteString("\nlocal decides = {}\n")
	for i, f := range files {
		_, _, decide := splitFile(f, texts[i])
		m := runCall.FindStringSubmatchIndex(decide)
		if m == nil {
			panic("redisstore: lua/" + f + " does not end with return run(...)") // embedded: cannot happen
		}
		b.WriteString("\ndo\n")
		b.WriteString(decide[:m[0]])
		fmt.Fprintf(b, "decides['%s'] = decide\n", names[i])
		end(names[i], decide[m[2]:m[3]])
		b.WriteString("end\n")
	}
}

// composeAll returns the script of lua/all.lua: lib.lua, every decide as
// writeDecides writes them, and all.lua.
func composeAll(lib string, bodies [len(keyNames)]string, cal, all string) string {
	var b strings.Builder
	b.WriteString(lib)
	writeDecides(&b, bodies, cal, func(string, string) {})
	b.WriteString("\n")
	b.WriteString(all)
	return b.String()
}

// loadLibrary loads the function library on every server the client
// talks to and reports whether the store can call it: false, with no
// error, on servers without functions (Redis 6.2) and on clients whose
// servers it cannot enumerate.
func (s *Store) loadLibrary(ctx context.Context) (bool, error) {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, library).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // its name holds its hash: the same library
		}
		return err
	}
	var err error
	switch c := s.client.(type) {
	case *redis.Client:
		err = load(ctx, c)
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, load)
	default:
		return false, nil
	}
	if err != nil && isUnknownCommand(err) {
		return false, nil
	}
	return err == nil, err
}

func isUnknownCommand(err error) bool {
	return redis.HasErrorPrefix(err, "unknown command")
}

// isMissingFunction reports whether err is a server's answer that it has no
// such function, or no functions at all.
func isMissingFunction(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found") || isUnknownCommand(err)
}
