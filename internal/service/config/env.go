package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
)

// FromEnv returns where envoyproxy/ratelimit, configured by the
// environment that getenv reads (os.Getenv in a service), loads its rules
// files from, and the options under which Load picks and reads them as it
// does:
//
//   - the directory RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
//     (defaults "/srv/runtime_data/current", none, "config"), read with
//     WithRuntimeTree;
//   - WithDotFiles unless RUNTIME_IGNOREDOTFILES is true;
//   - WithMergeDomains when MERGE_DOMAIN_CONFIG is true.
//
// Booleans are spelled as strconv.ParseBool accepts them ("true", "1",
// "false", …), as envoyproxy/ratelimit reads them. It is an error when
// RUNTIME_SUBDIRECTORY is empty and RUNTIME_WATCH_ROOT is true (its
// default): envoyproxy/ratelimit loads no rules at all then. With
// RUNTIME_WATCH_ROOT true, envoyproxy/ratelimit also reads the files of
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY whose names start with
// RUNTIME_APPDIRECTORY and a dot (a file "config.yaml", a directory
// "config.old"); Load does not.
func FromEnv(getenv func(string) string) (path string, opts []Option, err error) {
	get := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	flag := func(name string, def bool) bool {
		v := getenv(name)
		if v == "" {
			return def
		}
		b, perr := strconv.ParseBool(v)
		if perr != nil {
			err = errors.Join(err, fmt.Errorf("config: %s=%q: want true or false", name, v))
		}
		return b
	}
	root := get("RUNTIME_ROOT", "/srv/runtime_data/current")
	sub := getenv("RUNTIME_SUBDIRECTORY")
	app := get("RUNTIME_APPDIRECTORY", "config")
	ignoreDot := flag("RUNTIME_IGNOREDOTFILES", false)
	watchRoot := flag("RUNTIME_WATCH_ROOT", true)
	merge := flag("MERGE_DOMAIN_CONFIG", false)
	if err != nil {
		return "", nil, err
	}
	if sub == "" && watchRoot {
		return "", nil, errors.New("config: RUNTIME_SUBDIRECTORY is empty: envoyproxy/ratelimit loads no rules without it (unless RUNTIME_WATCH_ROOT=false)")
	}
	opts = []Option{WithRuntimeTree()}
	if !ignoreDot {
		opts = append(opts, WithDotFiles())
	}
	if merge {
		opts = append(opts, WithMergeDomains())
	}
	return filepath.Join(root, sub, app), opts, nil
}
