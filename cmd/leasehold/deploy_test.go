package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/lab/pgtest"
)

// The deployment files, from this package's directory.
const (
	dockerfilePath = "../../Dockerfile"
	kubernetesDir  = "../../deploy/kubernetes"
)

// TestKubernetesManifests checks that deploy/kubernetes keeps its promises
// to the binary and to the Dockerfile: three replicas rolled one at a time;
// probes on routes the server has, on the port it listens on; the replica
// named after its pod; the database URLs from the Secret; every variable
// one the binary reads, with a value it accepts; a grace period that covers
// the preStop pause, the shutdown grace and the release of the leases; and
// the pod running as the image's non-root user on a read-only filesystem.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	kust := readYAML(t, filepath.Join(kubernetesDir, "kustomization.yaml"))
	objects := map[string]any{} // by kind
	for _, res := range yamlList(t, kust, "resources") {
		name, _ := res.(string)
		obj := readYAML(t, filepath.Join(kubernetesDir, name))
		objects[yamlStr(t, obj, "kind")] = obj
	}
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget"} {
		if objects[kind] == nil {
			t.Fatalf("kustomization.yaml: no %s among its resources", kind)
		}
	}
	dep, svc, pdb := objects["Deployment"], objects["Service"], objects["PodDisruptionBudget"]
	spec := yamlGet(t, dep, "spec")
	pod := yamlGet(t, spec, "template", "spec")
	ctr := yamlNamed(t, yamlList(t, pod, "containers"), "leasehold")
	image := readDockerfile(t)

	if got := yamlStr(t, spec, "replicas"); got != "3" {
		t.Errorf("Deployment replicas: %s, want 3", got)
	}
	if got := yamlStr(t, spec, "strategy", "rollingUpdate", "maxUnavailable"); got != "1" {
		t.Errorf("Deployment maxUnavailable: %s, want 1 (one replica at a time)", got)
	}
	labels := yamlGet(t, spec, "template", "metadata", "labels").(map[string]any)
	for what, sel := range map[string]any{
		"Deployment selector": yamlGet(t, spec, "selector", "matchLabels"),
		"Service selector":    yamlGet(t, svc, "spec", "selector"),
		"PDB selector":        yamlGet(t, pdb, "spec", "selector", "matchLabels"),
	} {
		for k, v := range sel.(map[string]any) {
			if labels[k] != v {
				t.Errorf("%s %s=%v does not match the pods' labels %v", what, k, v, labels)
			}
		}
	}

	// The environment: known to the binary, accepted by it, and the
	// secrets from the Secret, never in the manifest.
	known := envNames(t)
	vars := map[string]any{}
	var plain []string // name, value pairs of the literal values
	for _, e := range yamlList(t, ctr, "env") {
		name := yamlStr(t, e, "name")
		vars[name] = e
		if !known[name] {
			t.Errorf("env %s: leasehold reads no such variable (it reads %v)", name, slices.Sorted(maps.Keys(known)))
		}
		if v, ok := e.(map[string]any)["value"]; ok {
			plain = append(plain, name, v.(string))
		}
	}
	if got := yamlStr(t, vars["LEASEHOLD_INSTANCE"], "valueFrom", "fieldRef", "fieldPath"); got != "metadata.name" {
		t.Errorf("LEASEHOLD_INSTANCE from %q, want the pod's name (metadata.name): unique among live replicas", got)
	}
	for _, name := range []string{"DATABASE_URL", "LEASEHOLD_LISTEN_DATABASE_URL", "LEASEHOLD_API_TOKEN"} {
		if vars[name] == nil {
			t.Errorf("env %s: not set", name)
			continue
		}
		yamlStr(t, vars[name], "valueFrom", "secretKeyRef", "key")
	}
	if yamlStr(t, vars["LEASEHOLD_LISTEN_DATABASE_URL"], "valueFrom", "secretKeyRef", "optional") != "true" {
		t.Errorf("LEASEHOLD_LISTEN_DATABASE_URL: the Secret's key must be optional (without it, DATABASE_URL serves)")
	}
	// The example Secret has every key the Deployment needs, and no other.
	secret := readYAML(t, filepath.Join(kubernetesDir, "secret.example.yaml"))
	example := yamlGet(t, secret, "stringData").(map[string]any)
	refs := map[string]bool{}
	for name, e := range vars {
		from, _ := e.(map[string]any)["valueFrom"].(map[string]any)
		ref, ok := from["secretKeyRef"].(map[string]any)
		if !ok {
			continue
		}
		if ref["name"] != yamlStr(t, secret, "metadata", "name") {
			t.Errorf("env %s: from the Secret %v, the example is %s", name, ref["name"], yamlStr(t, secret, "metadata", "name"))
		}
		key := ref["key"].(string)
		refs[key] = true
		if _, ok := example[key]; !ok && ref["optional"] != "true" {
			t.Errorf("env %s: the Secret's key %s is required, and the example lacks it", name, key)
		}
	}
	for key := range example {
		if !refs[key] {
			t.Errorf("secret.example.yaml: key %s is read by nothing", key)
		}
	}
	// The replica's configuration: the literal values, and the example
	// Secret's for the keys it reads (its token, which a replica that
	// listens beyond its pod must have).
	fromSecret := map[string]string{}
	for name, e := range vars {
		from, _ := e.(map[string]any)["valueFrom"].(map[string]any)
		if ref, ok := from["secretKeyRef"].(map[string]any); ok {
			if v, ok := example[ref["key"].(string)].(string); ok {
				fromSecret[name] = v
			}
		}
	}
	c := serveConfig(t, nil, func(name string) string {
		if name == "DATABASE_URL" {
			return "postgres://placeholder@localhost/leasehold"
		}
		if v, ok := fromSecret[name]; ok {
			return v
		}
		return env(plain...)(name)
	})
	if !c.secured() {
		t.Errorf("the Deployment's replicas listen on %s without an API token", c.Addr)
	}

	// Ports: the container's, the one the server listens on, the image's,
	// the Service's target and the probes' all agree.
	port := yamlNamed(t, yamlList(t, ctr, "ports"), "http")
	containerPort := yamlStr(t, port, "containerPort")
	if _, p, err := net.SplitHostPort(c.Addr); err != nil || p != containerPort {
		t.Errorf("the server listens on %q, the container port is %s", c.Addr, containerPort)
	}
	if !slices.Contains(image.expose, containerPort) {
		t.Errorf("the container port %s is not among the image's EXPOSE %v", containerPort, image.expose)
	}
	if got := yamlStr(t, yamlNamed(t, yamlList(t, svc, "spec", "ports"), "http"), "targetPort"); got != "http" && got != containerPort {
		t.Errorf("Service targetPort %s, want the container port (http or %s)", got, containerPort)
	}
	probes := map[string]string{}
	for _, probe := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
		probes[probe] = yamlStr(t, ctr, probe, "httpGet", "path")
		if p := yamlStr(t, ctr, probe, "httpGet", "port"); p != "http" && p != containerPort {
			t.Errorf("%s on port %s, want the container port (http or %s)", probe, p, containerPort)
		}
	}
	if probes["readinessProbe"] != "/readyz" || probes["livenessProbe"] != "/healthz" {
		t.Errorf("probes %v: want readiness on /readyz (the database, migrations, the listener) and liveness on /healthz (the process only: a database outage must not restart every replica)", probes)
	}
	probeRoutes(t, slices.Collect(maps.Values(probes)))

	// Shutdown: the preStop pause needs no shell (the image has none), and
	// the grace period covers the pause, the tasks' shutdown grace, the
	// release of the leases (2 s) and the HTTP server's shutdown (10 s).
	preStop := yamlGet(t, ctr, "lifecycle", "preStop").(map[string]any)
	if _, ok := preStop["exec"]; ok || preStop["sleep"] == nil {
		t.Errorf("preStop %v: want the sleep action (the distroless image has no shell to exec sleep in)", preStop)
	}
	pause := manifestSeconds(t, yamlStr(t, preStop, "sleep", "seconds"))
	grace := manifestSeconds(t, yamlStr(t, pod, "terminationGracePeriodSeconds"))
	if need := pause + c.ShutdownGrace + 2*time.Second + 10*time.Second; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v: want more than preStop %v + --shutdown-grace %v + 12s to release the leases and close the server (%v)",
			grace, pause, c.ShutdownGrace, need)
	}

	// Security: the image's numeric non-root user, nothing more.
	if yamlStr(t, pod, "securityContext", "runAsNonRoot") != "true" {
		t.Errorf("pod securityContext: want runAsNonRoot: true")
	}
	if uid := yamlStr(t, pod, "securityContext", "runAsUser"); uid != image.uid {
		t.Errorf("pod runAsUser %s, want the image's USER %s", uid, image.uid)
	}
	for field, want := range map[string]string{"allowPrivilegeEscalation": "false", "readOnlyRootFilesystem": "true"} {
		if got := yamlStr(t, ctr, "securityContext", field); got != want {
			t.Errorf("container securityContext %s: %s, want %s", field, got, want)
		}
	}
	if drop := yamlList(t, ctr, "securityContext", "capabilities", "drop"); !slices.Contains(drop, any("ALL")) {
		t.Errorf("container capabilities drop %v, want ALL", drop)
	}
	if yamlStr(t, pod, "enableServiceLinks") != "false" {
		t.Errorf("enableServiceLinks: want false, or Kubernetes sets LEASEHOLD_* variables for the Service called leasehold")
	}
	yamlStr(t, ctr, "resources", "requests", "memory")
	yamlStr(t, ctr, "resources", "limits", "memory")
}

// probeRoutes checks that the server answers each of paths with 200: a
// replica on a fresh database.
func probeRoutes(t *testing.T, paths []string) {
	t.Helper()
	db := pgtest.New(t)
	r := startReplica(t, serveConfig(t, []string{"--addr", "127.0.0.1:0", "--instance", "probe-replica", "--roles", "api"},
		env("DATABASE_URL", db.URL)))
	for _, path := range paths {
		if status, body := r.get(t, path, ""); status != http.StatusOK {
			t.Errorf("probe GET %s: got %d %s, want 200", path, status, body)
		}
	}
}

// TestDockerfile checks what the Dockerfile promises without a Docker
// engine: a builder of the Go that go.mod asks for; a static binary (no
// cgo) without the builder's paths, with its version stamped; an image
// that runs it as a numeric non-root user, exposes its port and serves by
// default.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	d := readDockerfile(t)
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if len(goVersion) != 2 {
		t.Fatalf("go.mod: no go directive")
	}
	if !strings.HasPrefix(d.builder, "golang:"+string(goVersion[1])) {
		t.Errorf("builder %q, want golang:%s (go.mod)", d.builder, goVersion[1])
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "./cmd/leasehold", "--mount=type=cache"} {
		if !strings.Contains(d.buildRun, want) {
			t.Errorf("the build step %q lacks %q", d.buildRun, want)
		}
	}
	if !strings.Contains(d.final, "distroless/static") && d.final != "scratch" {
		t.Errorf("final stage FROM %q, want distroless static or scratch (a static binary needs nothing else)", d.final)
	}
	if uid, err := strconv.Atoi(d.uid); err != nil || uid == 0 {
		t.Errorf("USER %q: want a numeric uid other than 0, so that runAsNonRoot can check it", d.uid)
	}
	if !slices.Contains(d.expose, "8080") {
		t.Errorf("EXPOSE %v, want 8080", d.expose)
	}
	// The image listens on every interface of its container, on the port it
	// exposes: so it must be given a token, or refuse to serve.
	if _, port, err := net.SplitHostPort(d.env["LEASEHOLD_ADDR"]); err != nil || !slices.Contains(d.expose, port) || loopback(d.env["LEASEHOLD_ADDR"]) {
		t.Errorf("ENV LEASEHOLD_ADDR=%q, want every interface, on the port the image exposes (%v)", d.env["LEASEHOLD_ADDR"], d.expose)
	}
	imageEnv := func(kv ...string) func(string) string {
		for k, v := range d.env {
			kv = append(kv, k, v)
		}
		return env(append(kv, "DATABASE_URL", "postgres://placeholder@localhost/leasehold")...)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	finish := configFlags(fs, imageEnv(), productionReplica)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := finish(); err == nil || !strings.Contains(err.Error(), "no API token is set") {
		t.Errorf("the image without a token: %v; want it refused for want of one", err)
	}
	if c := serveConfig(t, nil, imageEnv("LEASEHOLD_API_TOKEN", "a-token-of-the-image-test")); !c.secured() {
		t.Errorf("the image with LEASEHOLD_API_TOKEN: not secured")
	}
	if !strings.HasSuffix(d.entrypoint, "leasehold") || d.cmd != "serve" {
		t.Errorf("ENTRYPOINT %q CMD %q, want leasehold serve", d.entrypoint, d.cmd)
	}
	if d.output == "" || d.copied != d.output {
		t.Errorf("the build writes %q, the image copies %q", d.output, d.copied)
	}
}

// TestDockerBuildCommand runs the Dockerfile's build command, as it is but
// for where the binary goes, and checks what the image needs of its
// result: a static executable (the image has no C library) that reports
// its version and serves as an unprivileged user, the image's.
func TestDockerBuildCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary as the Dockerfile does")
	}
	t.Parallel()
	d := readDockerfile(t)
	dir, err := os.MkdirTemp("", "leasehold-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // the image's user must reach the binary
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "leasehold")
	command := strings.ReplaceAll(d.buildCommand, d.output, bin)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "sh", "-c", command)
	build.Dir = "../.."
	build.Env = append(os.Environ(), "VERSION=image-test")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	interp := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	f.Close()
	if err != nil || len(libs) > 0 || interp {
		t.Errorf("%s: dynamic libraries %v (%v), interpreter %v; want a static executable", bin, libs, err, interp)
	}

	uid, _ := strconv.Atoi(d.uid)
	asImageUser := func(cmd *exec.Cmd) {
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		}
	}
	version := exec.CommandContext(ctx, bin, "version")
	version.Env = []string{}
	asImageUser(version)
	if out, err := version.Output(); err != nil || strings.TrimSpace(string(out)) != "image-test" {
		t.Errorf("leasehold version: %q (%v), want image-test", out, err)
	}

	// Serve as the image's user: ready on the database, and a clean exit
	// on SIGTERM.
	db := pgtest.New(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	serve := exec.Command(bin, "serve")
	serve.Env = []string{"DATABASE_URL=" + db.URL, "LEASEHOLD_ADDR=" + addr, "LEASEHOLD_INSTANCE=image-test", "LEASEHOLD_ROLES=api"}
	asImageUser(serve)
	logs := &syncBuffer{}
	serve.Stdout, serve.Stderr = logs, logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = serve.Process.Kill()
			t.Logf("leasehold serve killed at the end of the test: %v", <-done)
		}
	})
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(time.Minute) // only so that a broken test ends
	for {
		res, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			exited = true
			t.Fatalf("leasehold serve as uid %d exited before it was ready: %v\n%s", uid, err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("leasehold serve as uid %d: not ready within a minute\n%s", uid, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		exited = true
		if err != nil {
			t.Errorf("leasehold serve after SIGTERM: %v, want exit status 0\n%s", err, logs)
		}
	case <-time.After(time.Minute):
		t.Fatalf("leasehold serve still running a minute after SIGTERM\n%s", logs)
	}
}

// dockerfile is what the tests read of the Dockerfile.
type dockerfile struct {
	builder      string // the image the binary is built in
	buildRun     string // the RUN instruction that builds it, options included
	buildCommand string // its shell command
	output       string // where the build writes the binary
	final        string // the image of the last stage
	copied       string // what the last stage copies from the builder
	uid          string // the last stage's USER, without its group
	expose       []string
	entrypoint   string // the last of ENTRYPOINT's words
	cmd          string // CMD's words, joined by spaces
	env          map[string]string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	// Instructions, continuation lines joined, comments dropped.
	text := regexp.MustCompile(`(?m)^\s*#.*\n`).ReplaceAllString(string(raw), "")
	text = strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		instr, args, _ := strings.Cut(strings.TrimSpace(line), " ")
		args = strings.TrimSpace(args)
		switch strings.ToUpper(instr) {
		case "FROM":
			image, _, _ := strings.Cut(args, " ")
			if d.builder == "" {
				d.builder = image
			}
			d.final = image
		case "RUN":
			if strings.Contains(args, "go build") {
				d.buildRun = args
				cmd := args
				for strings.HasPrefix(cmd, "--") {
					_, cmd, _ = strings.Cut(cmd, " ")
					cmd = strings.TrimSpace(cmd)
				}
				d.buildCommand = cmd
				if m := regexp.MustCompile(`-o\s+(\S+)`).FindStringSubmatch(cmd); m != nil {
					d.output = m[1]
				}
			}
		case "COPY":
			if f := strings.Fields(args); len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				d.copied = f[1]
			}
		case "USER":
			d.uid, _, _ = strings.Cut(args, ":")
		case "EXPOSE":
			d.expose = append(d.expose, strings.Fields(args)...)
		case "ENV":
			if d.env == nil {
				d.env = map[string]string{}
			}
			for _, kv := range strings.Fields(args) {
				k, v, _ := strings.Cut(kv, "=")
				d.env[k] = strings.Trim(v, `"`)
			}
		case "ENTRYPOINT", "CMD":
			var words []string
			if err := json.Unmarshal([]byte(args), &words); err != nil || len(words) == 0 {
				t.Fatalf("Dockerfile: %s %s: want the exec form, a JSON array", instr, args)
			}
			if instr == "CMD" {
				d.cmd = strings.Join(words, " ")
			} else {
				d.entrypoint = words[len(words)-1]
			}
		}
	}
	if d.buildCommand == "" {
		t.Fatalf("Dockerfile: no RUN instruction with go build")
	}
	return d
}

// envNames returns the environment variables serve reads, from its flags'
// usage ("(env NAME...").
func envNames(t *testing.T) map[string]bool {
	t.Helper()
	fs := flag.NewFlagSet("leasehold serve", flag.ContinueOnError)
	configFlags(fs, env(), productionReplica)
	names := map[string]bool{}
	re := regexp.MustCompile(`\(env ([A-Z_]+)`)
	fs.VisitAll(func(f *flag.Flag) {
		if m := re.FindStringSubmatch(f.Usage); m != nil {
			names[m[1]] = true
		}
	})
	if !names["DATABASE_URL"] || !names["LEASEHOLD_ADDR"] {
		t.Fatalf("serve's flags name no DATABASE_URL or LEASEHOLD_ADDR in their usage: %v", names)
	}
	return names
}

// manifestSeconds parses a whole number of seconds.
func manifestSeconds(t *testing.T, s string) time.Duration {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: want a whole number of seconds", s)
	}
	return time.Duration(n) * time.Second
}

// yamlGet follows path (keys of mappings) from v.
func yamlGet(t *testing.T, v any, path ...string) any {
	t.Helper()
	for i, key := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: not a mapping", strings.Join(path[:i], "."))
		}
		if v, ok = m[key]; !ok {
			t.Fatalf("%s: missing", strings.Join(path[:i+1], "."))
		}
	}
	return v
}

// yamlStr is the scalar at path.
func yamlStr(t *testing.T, v any, path ...string) string {
	t.Helper()
	s, ok := yamlGet(t, v, path...).(string)
	if !ok {
		t.Fatalf("%s: not a scalar", strings.Join(path, "."))
	}
	return s
}

// yamlList is the sequence at path.
func yamlList(t *testing.T, v any, path ...string) []any {
	t.Helper()
	l, ok := yamlGet(t, v, path...).([]any)
	if !ok {
		t.Fatalf("%s: not a sequence", strings.Join(path, "."))
	}
	return l
}

// yamlNamed is the mapping of items whose name is name.
func yamlNamed(t *testing.T, items []any, name string) any {
	t.Helper()
	for _, it := range items {
		if m, ok := it.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	t.Fatalf("no item named %q", name)
	return nil
}

// readYAML reads a file of the block-style YAML the manifests are written
// in (mappings, sequences, plain and quoted scalars, comments) into maps,
// slices and strings: enough to check what they say without a YAML module.
// What it does not know (flow collections, block scalars, anchors, several
// documents) fails the test rather than being misread.
func readYAML(t *testing.T, path string) any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := parseYAML(string(raw))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

type yamlLine struct {
	indent int
	text   string
	n      int // line number
}

type yamlParser struct {
	lines []yamlLine
	i     int
}

func parseYAML(src string) (any, error) {
	var p yamlParser
	for i, raw := range strings.Split(src, "\n") {
		s := strings.TrimRight(stripYAMLComment(raw), " \t\r")
		if strings.TrimSpace(s) == "" {
			continue
		}
		text := strings.TrimLeft(s, " ")
		if strings.HasPrefix(text, "\t") {
			return nil, fmt.Errorf("line %d: a tab in the indentation", i+1)
		}
		if text == "---" || text == "..." {
			if len(p.lines) > 0 {
				return nil, fmt.Errorf("line %d: a second document", i+1)
			}
			continue
		}
		p.lines = append(p.lines, yamlLine{indent: len(s) - len(text), text: text, n: i + 1})
	}
	if len(p.lines) == 0 {
		return nil, errors.New("empty")
	}
	v, err := p.block()
	if err == nil && p.i < len(p.lines) {
		err = fmt.Errorf("line %d: unexpected indentation", p.lines[p.i].n)
	}
	return v, err
}

// stripYAMLComment drops a comment: # at the start or after a space,
// outside quotes.
func stripYAMLComment(s string) string {
	var quote rune
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '"' || r == '\'':
			quote = r
		case r == '#' && (i == 0 || s[i-1] == ' '):
			return s[:i]
		}
	}
	return s
}

func isYAMLItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// block reads the mapping or sequence that starts at the current line.
func (p *yamlParser) block() (any, error) {
	l := p.lines[p.i]
	if isYAMLItem(l.text) {
		return p.sequence(l.indent)
	}
	return p.mapping(l.indent)
}

// nested reads the value of a key or item with nothing after it on its
// line: a block indented deeper, or a sequence at the key's indentation.
func (p *yamlParser) nested(indent int, key bool) (any, error) {
	if p.i < len(p.lines) {
		next := p.lines[p.i]
		if next.indent > indent || (key && next.indent == indent && isYAMLItem(next.text)) {
			return p.block()
		}
	}
	return "", nil
}

func (p *yamlParser) sequence(indent int) ([]any, error) {
	var out []any
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && isYAMLItem(p.lines[p.i].text) {
		l := p.lines[p.i]
		rest := strings.TrimLeft(strings.TrimPrefix(l.text, "-"), " ")
		var (
			v   any
			err error
		)
		switch _, _, isKey := splitYAMLKey(rest); {
		case rest == "":
			p.i++
			v, err = p.nested(indent, false)
		case isKey:
			// A mapping whose first key is on the item's line: read that
			// line again as if it stood alone at its column.
			p.lines[p.i] = yamlLine{indent: indent + len(l.text) - len(rest), text: rest, n: l.n}
			v, err = p.mapping(p.lines[p.i].indent)
		default:
			p.i++
			v, err = yamlScalar(rest, l.n)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (p *yamlParser) mapping(indent int) (map[string]any, error) {
	m := map[string]any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && !isYAMLItem(p.lines[p.i].text) {
		l := p.lines[p.i]
		key, val, ok := splitYAMLKey(l.text)
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not key: value", l.n, l.text)
		}
		if _, dup := m[key]; dup {
			return nil, fmt.Errorf("line %d: %s given twice", l.n, key)
		}
		p.i++
		var (
			v   any
			err error
		)
		if val == "" {
			v, err = p.nested(indent, true)
		} else {
			v, err = yamlScalar(val, l.n)
		}
		if err != nil {
			return nil, err
		}
		m[key] = v
	}
	if p.i < len(p.lines) && p.lines[p.i].indent > indent {
		return nil, fmt.Errorf("line %d: unexpected indentation", p.lines[p.i].n)
	}
	return m, nil
}

// splitYAMLKey splits "key: value" (or "key:") outside quotes.
func splitYAMLKey(text string) (key, val string, ok bool) {
	if strings.HasPrefix(text, `"`) || strings.HasPrefix(text, "'") {
		return "", "", false
	}
	if k, ok := strings.CutSuffix(text, ":"); ok && !strings.Contains(k, ": ") {
		return k, "", true
	}
	k, v, ok := strings.Cut(text, ": ")
	return k, strings.TrimSpace(v), ok
}

func yamlScalar(s string, n int) (any, error) {
	switch {
	case strings.HasPrefix(s, `"`):
		u, err := strconv.Unquote(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, s, err)
		}
		return u, nil
	case strings.HasPrefix(s, "'"):
		if len(s) < 2 || !strings.HasSuffix(s, "'") {
			return nil, fmt.Errorf("line %d: unterminated %s", n, s)
		}
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'"), nil
	case strings.ContainsAny(s[:1], "[{|>&*!%@`"):
		return nil, fmt.Errorf("line %d: %s: this reader knows block style and plain or quoted scalars only", n, s)
	}
	return s, nil
}

// TestParseYAML checks the manifests' reader on what it must read and
// what it must refuse.
func TestParseYAML(t *testing.T) {
	t.Parallel()
	got, err := parseYAML(`# a comment
a: 1
b:
  c: "x # not a comment"
  d: 'it''s'
e:
  - f
  - g: h
    i: j
  -
    k: l
m:
- n
o: p # a comment
`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"a": "1",
		"b": map[string]any{"c": "x # not a comment", "d": "it's"},
		"e": []any{"f", map[string]any{"g": "h", "i": "j"}, map[string]any{"k": "l"}},
		"m": []any{"n"},
		"o": "p",
	}
	if g, w := fmt.Sprint(got), fmt.Sprint(want); g != w {
		t.Errorf("parseYAML: got %s, want %s", g, w)
	}
	for _, bad := range []string{
		"a: [1, 2]\n",
		"a: {b: c}\n",
		"a: |\n  text\n",
		"a: 1\na: 2\n",
		"a:\n  b: 1\n    c: 2\n",
		"a: 1\n---\nb: 2\n",
		"just text\n",
	} {
		if v, err := parseYAML(bad); err == nil {
			t.Errorf("parseYAML(%q) = %v, want an error", bad, v)
		}
	}
}
