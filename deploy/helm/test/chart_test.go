// Package test renders the chart in ../tollgate with Helm's own loader and
// engine, as helm install and helm template do, decodes every object into
// Kubernetes' API types (refusing unknown fields), and runs the rendered
// container's command line against a real Redis. It is a module of its own
// so that Helm's and Kubernetes' packages stay out of tollgate's go.mod.
package test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// objects are the kinds the chart renders, decoded.
type objects struct {
	deploy    *appsv1.Deployment
	service   *corev1.Service
	configMap *corev1.ConfigMap
	pdb       *policyv1.PodDisruptionBudget
}

// render renders the chart as release "rl" with values over its defaults.
func render(t *testing.T, values map[string]any) (objects, error) {
	t.Helper()
	chrt, err := loader.Load("../tollgate")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{Name: "rl", Namespace: "default", Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return objects{}, err
	}
	out, err := engine.Render(chrt, vals)
	if err != nil {
		return objects{}, err
	}
	var o objects
	for name, text := range out {
		for _, doc := range strings.Split(text, "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			var into any
			switch meta.Kind {
			case "Deployment":
				o.deploy = new(appsv1.Deployment)
				into = o.deploy
			case "Service":
				o.service = new(corev1.Service)
				into = o.service
			case "ConfigMap":
				o.configMap = new(corev1.ConfigMap)
				into = o.configMap
			case "PodDisruptionBudget":
				o.pdb = new(policyv1.PodDisruptionBudget)
				into = o.pdb
			default:
				t.Fatalf("%s: unexpected kind %q", name, meta.Kind)
			}
			// Strict: a field the API does not have is an error, not ignored.
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("%s: not a valid %s: %v\n%s", name, meta.Kind, err, doc)
			}
		}
	}
	if o.deploy == nil || o.service == nil {
		t.Fatalf("rendered %d templates without a Deployment and a Service", len(out))
	}
	return o, nil
}

func mustRender(t *testing.T, values map[string]any) objects {
	t.Helper()
	o, err := render(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return o
}

func redisSecret(name string) map[string]any { return map[string]any{"secretName": name} }

func TestChartDefaults(t *testing.T) {
	o := mustRender(t, map[string]any{"redis": redisSecret("tollgate-redis")})
	d := o.deploy
	if got, want := *d.Spec.Replicas, int32(2); got != want {
		t.Errorf("replicas = %d, want %d", got, want)
	}
	pod := d.Spec.Template
	for k, v := range d.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("the pods' labels %v do not match the selector %v", pod.Labels, d.Spec.Selector.MatchLabels)
		}
	}
	if o.pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	if got := o.pdb.Spec.MaxUnavailable; got == nil || got.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", got)
	}
	if got, want := o.pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels; !maps.Equal(got, want) {
		t.Errorf("PodDisruptionBudget selects %v, the Deployment %v", got, want)
	}
	if got, want := o.service.Spec.Selector, d.Spec.Selector.MatchLabels; !maps.Equal(got, want) {
		t.Errorf("Service selects %v, the Deployment %v", got, want)
	}

	c := container(t, d)
	if c.Image != "tollgate:latest" || len(c.Command) != 0 {
		t.Errorf("image %q, command %q: want tollgate:latest and its entrypoint (tollgate serve)", c.Image, c.Command)
	}
	for _, want := range []string{"--config=/etc/tollgate/rules", "--http=:8080", "--grpc=:8081", "--shutdown-delay=5s", "--drain-timeout=10s"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q: want %s", c.Args, want)
		}
	}
	for _, a := range c.Args {
		if strings.Contains(a, "tls") {
			t.Errorf("args %q: TLS without tls.secretName", c.Args)
		}
	}
	checkEnvFromSecret(t, c, "REDIS_URL", "tollgate-redis", "url", false)
	checkEnvFromSecret(t, c, "REDIS_AUTH", "tollgate-redis", "password", true)

	// The rules: the chart's ConfigMap, mounted whole so that updates reach
	// the pod (a subPath mount never sees them).
	if o.configMap == nil || o.configMap.Data["rules.yaml"] == "" {
		t.Fatalf("no ConfigMap with rules.yaml: %+v", o.configMap)
	}
	v := volume(t, d, "rules")
	if v.ConfigMap == nil || v.ConfigMap.Name != o.configMap.Name {
		t.Errorf("rules volume %+v, want the ConfigMap %s", v.VolumeSource, o.configMap.Name)
	}
	m := mount(t, c, "rules")
	if m.MountPath != "/etc/tollgate/rules" || m.SubPath != "" || !m.ReadOnly {
		t.Errorf("rules mount %+v, want /etc/tollgate/rules, read-only, no subPath", m)
	}

	checkProbes(t, c, "HTTP")
	if got, want := pod.Annotations, map[string]string{
		"prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics", "prometheus.io/scheme": "http",
	}; !maps.Equal(got, want) {
		t.Errorf("pod annotations %v, want %v", got, want)
	}

	sc, psc := c.SecurityContext, pod.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
		t.Errorf("pod securityContext %+v, want non-root 65532 (the image's user)", psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext %+v, want a read-only root, no privilege escalation", sc)
	}
}

func TestChartTLS(t *testing.T) {
	o := mustRender(t, map[string]any{
		"redis": redisSecret("tollgate-redis"),
		"tls":   map[string]any{"secretName": "tollgate-tls", "http": true, "clientCA": true},
	})
	c := container(t, o.deploy)
	for _, want := range []string{
		"--grpc-tls-cert=/etc/tollgate/tls/tls.crt", "--grpc-tls-key=/etc/tollgate/tls/tls.key", "--grpc-tls-client-ca=/etc/tollgate/tls/ca.crt",
		"--http-tls-cert=/etc/tollgate/tls/tls.crt", "--http-tls-key=/etc/tollgate/tls/tls.key", "--http-tls-client-ca=/etc/tollgate/tls/ca.crt",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q: want %s", c.Args, want)
		}
	}
	if v := volume(t, o.deploy, "tls"); v.Secret == nil || v.Secret.SecretName != "tollgate-tls" {
		t.Errorf("tls volume %+v, want the Secret tollgate-tls", v.VolumeSource)
	}
	if m := mount(t, c, "tls"); m.MountPath != "/etc/tollgate/tls" || m.SubPath != "" {
		t.Errorf("tls mount %+v, want /etc/tollgate/tls without subPath (tollgate re-reads renewed certificates)", m)
	}
	checkProbes(t, c, "HTTPS")
	if got := o.deploy.Spec.Template.Annotations["prometheus.io/scheme"]; got != "https" {
		t.Errorf("prometheus.io/scheme = %q, want https", got)
	}
}

func TestChartValues(t *testing.T) {
	one := mustRender(t, map[string]any{"replicaCount": 1, "rules": map[string]any{"existingConfigMap": "my-rules"},
		"podDisruptionBudget": map[string]any{"enabled": false}, "metrics": map[string]any{"annotations": false},
		"extraArgs": []any{"--failure-mode=closed"}, "readinessPath": "/healthcheck"})
	if *one.deploy.Spec.Replicas != 1 || one.configMap != nil || one.pdb != nil || len(one.deploy.Spec.Template.Annotations) != 0 {
		t.Errorf("replicas %d, ConfigMap %v, PDB %v, annotations %v: want 1 replica, the given ConfigMap only, no PDB, no annotations",
			*one.deploy.Spec.Replicas, one.configMap != nil, one.pdb != nil, one.deploy.Spec.Template.Annotations)
	}
	if v := volume(t, one.deploy, "rules"); v.ConfigMap == nil || v.ConfigMap.Name != "my-rules" {
		t.Errorf("rules volume %+v, want the ConfigMap my-rules", v.VolumeSource)
	}
	c := container(t, one.deploy)
	if got := c.ReadinessProbe.HTTPGet.Path; got != "/healthcheck" {
		t.Errorf("readiness probe on %s, want readinessPath's /healthcheck", got)
	}
	if !slices.Contains(c.Args, "--failure-mode=closed") || len(c.Env) != 0 {
		t.Errorf("args %q, env %v: want --failure-mode=closed, and no Redis (the memory store)", c.Args, c.Env)
	}
}

func TestChartRefuses(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"replicas without Redis", map[string]any{"replicaCount": 3}, "redis.secretName: more than one replica needs Redis"},
		{"no rules", map[string]any{"redis": redisSecret("r"), "rules": map[string]any{"files": nil}}, "rules: set rules.files or rules.existingConfigMap"},
		{"client CA without a Secret", map[string]any{"redis": redisSecret("r"), "tls": map[string]any{"clientCA": true}}, "tls.clientCA: needs tls.secretName"},
		// The bounds of values.schema.json, which Helm checks before rendering.
		{"no replica", map[string]any{"replicaCount": 0}, "replicaCount"},
		{"replicas as text", map[string]any{"replicaCount": "two"}, "replicaCount"},
		{"unknown log format", map[string]any{"redis": redisSecret("r"), "logFormat": "xml"}, "logFormat"},
		{"port out of range", map[string]any{"redis": redisSecret("r"), "service": map[string]any{"httpPort": 70000}}, "httpPort"},
		{"shutdown delay not a duration", map[string]any{"redis": redisSecret("r"), "shutdownDelay": "5 seconds"}, "shutdownDelay"},
		{"empty image", map[string]any{"redis": redisSecret("r"), "image": map[string]any{"repository": ""}}, "repository"},
		{"unknown value", map[string]any{"redis": redisSecret("r"), "replicas": 3}, "replicas"},
		{"readiness elsewhere", map[string]any{"redis": redisSecret("r"), "readinessPath": "/metrics"}, "readinessPath"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func container(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "tollgate" {
		t.Fatalf("containers %v, want one, tollgate", cs)
	}
	return cs[0]
}

func volume(t *testing.T, d *appsv1.Deployment, name string) corev1.Volume {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %q", name)
	return corev1.Volume{}
}

func mount(t *testing.T, c corev1.Container, name string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no volume mount %q", name)
	return corev1.VolumeMount{}
}

func checkEnvFromSecret(t *testing.T, c corev1.Container, name, secret, key string, optional bool) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		ref := e.ValueFrom
		if e.Value != "" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != secret || ref.SecretKeyRef.Key != key ||
			(ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional) != optional {
			t.Errorf("%s = %+v, want the key %s of the Secret %s (optional %v)", name, e, key, secret, optional)
		}
		return
	}
	t.Errorf("no %s in env %v", name, c.Env)
}

func checkProbes(t *testing.T, c corev1.Container, scheme corev1.URIScheme) {
	t.Helper()
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthcheck"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe %+v, want GET %s", p.what, p.probe, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port.String() != "http" || g.Scheme != scheme {
			t.Errorf("%s probe %s %s on %s, want %s %s on http", p.what, g.Scheme, g.Path, g.Port.String(), scheme, p.path)
		}
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) {
		t.Errorf("ports %v: want http on 8080", c.Ports)
	}
}
