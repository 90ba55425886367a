package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// secretMarker is what the tests below put in a variable that can carry a
// credential; it must never come out.
const secretMarker = "Zq7sekret"

// credentialName matches the names of envoy's variables that can carry a
// credential: a password, a token in a header, user information in a URL
// or an endpoint, anything in free-form metadata.
var credentialName = regexp.MustCompile(`AUTH$|PASSWORD|TOKEN|SECRET|KEY$|HEADERS$|NODE_METADATA$|_URL$|ENDPOINT$`)

// credentialVars is every variable of envoyVars marked as carrying a
// credential, or whose name says it can.
func credentialVars() []string {
	var names []string
	for _, v := range envoyVars {
		if v.secret || credentialName.MatchString(v.name) {
			names = append(names, v.name)
		}
	}
	return names
}

// secretShapes are values a credential-bearing variable may hold, each
// with the marker where the secret would be: alone, as user:password, in a
// URL's user information, among a list, in a header, and malformed.
var secretShapes = []string{
	secretMarker,
	"user:" + secretMarker,
	"user:" + secretMarker + "@127.0.0.1:6379",
	"127.0.0.1:6379,user:" + secretMarker + "@127.0.0.1:6380",
	"mymaster,user:" + secretMarker + "@127.0.0.1:26379",
	"authorization:Bearer " + secretMarker,
	"redis://user:" + secretMarker + "@127.0.0.1:6379",
	"no host " + secretMarker,
}

// secretBases are environments around the variable under test: with every
// switch that makes envoy read a group of variables on (xDS, per-second
// Redis, statsd, memcache, Prometheus, tracing, TLS), and each REDIS_TYPE.
var secretBases = [][]string{
	{},
	{"CONFIG_TYPE=GRPC_XDS_SOTW", "REDIS_PERSECOND=true", "USE_STATSD=true", "USE_DOG_STATSD=true", "BACKEND_TYPE=memcache",
		"USE_PROMETHEUS=true", "TRACING_ENABLED=true", "GRPC_SERVER_USE_TLS=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_TLS=true"},
	{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_TYPE=SINGLE"},
	{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_TYPE=SENTINEL"},
	{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_TYPE=CLUSTER"},
	{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_TYPE=ring"},
	{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:6379", "REDIS_POOL_SIZE=many", "REDIS_TIMEOUT=soon"},
}

// TestEnvoyEnvSecretsNeverShown sets every credential-bearing variable of
// the table, in every shape, in every environment above, and parses serve's
// flags as the binary does: whatever is refused or malformed, what serve
// prints names the variable but never holds its value.
func TestEnvoyEnvSecretsNeverShown(t *testing.T) {
	t.Parallel()
	vars := credentialVars()
	if len(vars) < 8 {
		t.Fatalf("only %d credential-bearing variables found: %v", len(vars), vars)
	}
	for _, name := range vars {
		for _, shape := range secretShapes {
			for _, base := range secretBases {
				env := append(append([]string(nil), base...), name+"="+shape)
				var out bytes.Buffer
				if _, _, ok := parseServe([]string{"--config", "rules.yaml"}, envOf(env...), &out); !ok && out.Len() == 0 {
					t.Errorf("%v: refused without a word", env)
				}
				if strings.Contains(out.String(), secretMarker) {
					t.Errorf("%v: serve printed the value of %s:\n%s", env, name, out.String())
				}
			}
		}
	}
}

// TestServeEnvoyEnvironmentSecretsRefused starts the real binary with a
// credential in each of the variables that ask for what tollgate does not
// do, and with one in a REDIS_URL that is no host:port: it stops with exit
// status 2 and names the variable, and the credential appears nowhere in
// what it prints.
func TestServeEnvoyEnvironmentSecretsRefused(t *testing.T) {
	t.Parallel()
	root := runtimeTree(t, envoyEnvRules)
	for _, tc := range []struct {
		env  []string
		name string
	}{
		{[]string{"REDIS_PERSECOND=true", "REDIS_PERSECOND_AUTH=" + secretMarker}, "REDIS_PERSECOND_AUTH"},
		{[]string{"REDIS_PERSECOND=true", "REDIS_PERSECOND_SENTINEL_AUTH=user:" + secretMarker}, "REDIS_PERSECOND_SENTINEL_AUTH"},
		// xDS is honoured: the stream's headers beside a refused variable.
		{[]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer " + secretMarker,
			"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"}, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"},
		{[]string{"REDIS_URL=user:" + secretMarker + "@127.0.0.1:6379"}, "REDIS_URL"},
		{[]string{"REDIS_URL=user:" + secretMarker}, "REDIS_URL"}, // reads as host:port, the password the port
		{[]string{"REDIS_TYPE=CLUSTER", "REDIS_URL=127.0.0.1:6379,authorization:Bearer " + secretMarker}, "REDIS_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := tollgateBinary(t) // built first: the deadline is the run's
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "serve")
			cmd.Env = append(composeEnv("127.0.0.1:1", root), tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.name) {
				t.Errorf("output does not name %s:\n%s", tc.name, out)
			}
			if strings.Contains(string(out), secretMarker) {
				t.Errorf("output holds the value of %s:\n%s", tc.name, out)
			}
		})
	}
}

// TestEnvoyEnvSecretsMarked checks the table's marks: every variable whose
// name says it can carry a credential is marked secret, and envoySetting
// shows the value of no marked (or unknown) variable.
func TestEnvoyEnvSecretsMarked(t *testing.T) {
	t.Parallel()
	for _, v := range envoyVars {
		if credentialName.MatchString(v.name) && !v.secret {
			t.Errorf("%s: not marked secret, yet its name says it can carry a credential", v.name)
		}
		got := envoySetting(v.name, secretMarker)
		if v.secret == strings.Contains(got, secretMarker) {
			t.Errorf("envoySetting(%s) = %q (secret %v)", v.name, got, v.secret)
		}
	}
	if got := envoySetting("NOT_IN_THE_TABLE", secretMarker); strings.Contains(got, secretMarker) {
		t.Errorf("envoySetting of an unknown variable = %q", got)
	}
	if err := envoyErrorf("REDIS_AUTH", secretMarker, "--redis: %v", errors.New("bad "+secretMarker)); strings.Contains(err.Error(), secretMarker) {
		t.Errorf("envoyErrorf shows a wrapped error quoting a secret value: %v", err)
	}
}

// TestEnvoyEnvMessagesThroughOnePlace reads the envoy-mode sources: no
// message there formats a variable's value itself (NAME=%q); each goes
// through envoyErrorf, which asks envoySetting.
func TestEnvoyEnvMessagesThroughOnePlace(t *testing.T) {
	t.Parallel()
	direct := regexp.MustCompile(`=%q|%s=%[qv]`)
	for _, f := range []string{"envoyenv.go", "envoyflags.go", "envoyredis.go", "envoyextras.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if direct.MatchString(line) && !strings.Contains(line, "func envoySetting") && !strings.Contains(line, `return fmt.Sprintf("%s=%q", name, value)`) {
				t.Errorf("%s:%d formats a value itself: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
