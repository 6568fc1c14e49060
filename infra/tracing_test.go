package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// tracingKeys are the environment variables tracing adds to the reconciler.
var tracingKeys = []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME",
	collectorConfigEnv, "OPENTELEMETRY_COLLECTOR_CONFIG_URI"}

// withoutTracing is env without tracingKeys, for the checks of everything else.
func withoutTracing(env any) obj {
	out := obj{}
	m, _ := env.(obj)
	for k, v := range m {
		if !slices.Contains(tracingKeys, k) {
			out[k] = v
		}
	}
	return out
}

// subText is the template text of an Fn::Sub, or "".
func subText(v any) string {
	s, _ := path(v, "Fn::Sub").(string)
	return s
}

// checkCollectorConfig checks a collector configuration: OTLP/HTTP in on loopback,
// out signed (SigV4, service xray) to the region's X-Ray OTLP endpoint.
func checkCollectorConfig(t *testing.T, who string, cfg any) {
	t.Helper()
	text := subText(cfg)
	for _, want := range []string{
		"endpoint: 127.0.0.1:4318",
		"traces_endpoint: https://xray.${AWS::Region}.${AWS::URLSuffix}/v1/traces",
		"authenticator: sigv4auth",
		"service: xray",
		"region: ${AWS::Region}",
		"exporters: [otlphttp]",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("%s collector configuration lacks %q:\n%s", who, want, text)
		}
	}
}

// By default (cdk.json has no tracing knob) both the workers and the reconciler
// export spans to X-Ray: the worker through a collector sidecar that cannot take
// the task down, the reconciler through the ADOT collector layer, each role with
// exactly the X-Ray OTLP grant.
func TestTracingOn(t *testing.T) {
	_, j := template(t)
	x := findIDs(t, j)
	_, task := only(t, j, "AWS::ECS::TaskDefinition", nil)
	defs := asSlice(path(task, "ContainerDefinitions"))
	if len(defs) != 2 || path(defs[0], "Name") != "worker" || path(defs[1], "Name") != collectorContainer {
		t.Fatalf("containers %v, want the worker, then the collector", defs)
	}
	col := defs[1]
	wantSame(t, "collector image", path(col, "Image"), adotCollectorImage)
	wantSame(t, "collector essential", path(col, "Essential"), false)
	wantSame(t, "collector memory cap", path(col, "Memory"), float64(128))
	if pm := path(col, "PortMappings"); pm != nil {
		t.Errorf("collector port mappings %v: it serves the task's loopback only", pm)
	}
	if d := path(defs[0], "DependsOn"); d != nil {
		t.Errorf("the worker waits for %v: it must start whether or not the collector does", d)
	}
	var aot any
	for _, e := range asSlice(path(col, "Environment")) {
		if path(e, "Name") == "AOT_CONFIG_CONTENT" {
			aot = path(e, "Value")
		}
	}
	checkCollectorConfig(t, "sidecar", aot)
	if !strings.Contains(subText(aot), "processors: [batch]") {
		t.Errorf("sidecar pipeline without batching:\n%s", subText(aot))
	}

	_, fn := only(t, j, "AWS::Lambda::Function", func(p obj) bool { return p["Handler"] == "bootstrap" })
	env, _ := path(fn, "Environment", "Variables").(obj)
	wantSame(t, "reconciler OTLP endpoint", env["OTEL_EXPORTER_OTLP_ENDPOINT"], "http://127.0.0.1:4318")
	wantSame(t, "reconciler service name", env["OTEL_SERVICE_NAME"], "sockfleet-reconciler")
	wantSame(t, "reconciler collector configuration", env["OPENTELEMETRY_COLLECTOR_CONFIG_URI"], "env:"+collectorConfigEnv)
	checkCollectorConfig(t, "Lambda layer", env[collectorConfigEnv])
	if strings.Contains(subText(env[collectorConfigEnv]), "[batch]") {
		t.Error("the Lambda layer's pipeline batches: spans would wait past the invocation")
	}
	layers := asSlice(path(fn, "Layers"))
	if len(layers) != 1 || !strings.Contains(subText(layers[0]), ":901920570463:layer:aws-otel-collector-arm64-ver-") {
		b, _ := json.Marshal(layers)
		t.Errorf("reconciler layers %s, want the ADOT collector layer for arm64", b)
	}

	roles := roleStatements(j)
	for _, role := range []string{x.taskRole, x.reconcilerRole} {
		n := 0
		for _, s := range roles[role] {
			if slices.ContainsFunc(s.actions, func(a string) bool { return strings.HasPrefix(a, "xray:") }) {
				n++
				wantSame(t, role+" X-Ray actions", s.actions, xrayWrite)
			}
		}
		if n != 1 {
			t.Errorf("%s: %d X-Ray statements, want 1", role, n)
		}
	}
	if slices.ContainsFunc(actionSet(roles[x.execRole]), func(a string) bool { return strings.HasPrefix(a, "xray:") }) {
		t.Error("the task execution role may write to X-Ray: only the task role signs spans")
	}
}

// tracing=false: no collector, no layer, no X-Ray grant, no OTEL_* setting.
func TestTracingOff(t *testing.T) {
	for _, v := range []any{false, "false"} {
		_, j := synthWith(t, map[string]any{ctxTracing: v})
		_, task := only(t, j, "AWS::ECS::TaskDefinition", nil)
		if n := len(asSlice(path(task, "ContainerDefinitions"))); n != 1 {
			t.Errorf("tracing=%v: %d containers, want the worker alone", v, n)
		}
		for k := range workerEnv(t, j) {
			if strings.HasPrefix(k, "OTEL_") {
				t.Errorf("tracing=%v: worker has %s", v, k)
			}
		}
		_, fn := only(t, j, "AWS::Lambda::Function", func(p obj) bool { return p["Handler"] == "bootstrap" })
		if l := path(fn, "Layers"); l != nil {
			t.Errorf("tracing=%v: reconciler layers %v", v, l)
		}
		env, _ := path(fn, "Environment", "Variables").(obj)
		for _, k := range tracingKeys {
			if _, ok := env[k]; ok {
				t.Errorf("tracing=%v: reconciler has %s", v, k)
			}
		}
		for role, stmts := range roleStatements(j) {
			if a := actionSet(stmts); slices.ContainsFunc(a, func(a string) bool { return strings.HasPrefix(a, "xray:") }) {
				t.Errorf("tracing=%v: role %s has %v", v, role, a)
			}
		}
	}
}

func TestTracingKnobRejectsNonBool(t *testing.T) {
	_, err := ConfigFromContext(func(key string) any {
		if key == ctxTracing {
			return "yes"
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), ctxTracing) {
		t.Errorf("tracing=yes: err %v, want one naming the knob", err)
	}
	c, err := ConfigFromContext(func(string) any { return nil })
	if err != nil || !c.Tracing {
		t.Errorf("default: tracing %v (%v), want on", c.Tracing, err)
	}
}
