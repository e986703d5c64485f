#!/usr/bin/env bash
# Static checks of the shipped observability assets (run by .ci/run):
#  1. deploy/grafana/cairn.json is what build_dashboard.py generates (no drift);
#  2. every PromQL expression of the dashboard and the alert rules parses (promtool);
#  3. the alert rules' unit tests fire and resolve every alert (promtool test rules);
#  4. the dashboard validates against the Grafana dashboard JSON schema derived from the npm
#     package @grafana/schema (ts-json-schema-generator), checked with check-jsonschema.
# Needs promtool (../shared/tools/prometheus installs it), node/npm and python3/pip.
set -euo pipefail
cd "$(dirname "$0")/.."

GRAFANA_SCHEMA_VERSION=13.2.3
TS_JSON_SCHEMA_GENERATOR_VERSION=2.4.0
CHECK_JSONSCHEMA_VERSION=0.39.0

tools=${CAIRN_SHARED_TOOLS:-../shared/tools}  # .ci/run sets it
promtool() {
  if command -v promtool >/dev/null 2>&1; then command promtool "$@"; else "$tools/prometheus" promtool "$@"; fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "-- dashboard is generated from deploy/grafana/build_dashboard.py"
cp deploy/grafana/cairn.json "$work/committed.json"
python3 deploy/grafana/build_dashboard.py
if ! diff -u "$work/committed.json" deploy/grafana/cairn.json; then
  cp "$work/committed.json" deploy/grafana/cairn.json
  echo "deploy/grafana/cairn.json is stale: run python3 deploy/grafana/build_dashboard.py" >&2
  exit 1
fi

echo "-- PromQL of the dashboard parses"
python3 - "$work/dashboard-rules.yaml" <<'PY'
import json, sys
d = json.load(open("deploy/grafana/cairn.json"))
subst = {"$__rate_interval": "1m", "$job": ".*", "$instance": ".*", "$boundary": ".*"}
lines = ["groups:", "  - name: dashboard", "    rules:"]
n = 0
for p in d["panels"]:
    for t in p.get("targets", []):
        expr = t["expr"]
        for k, v in subst.items():
            expr = expr.replace(k, v)
        n += 1
        lines.append(f"      - record: dashboard:expr_{n}")
        lines.append("        expr: " + json.dumps(expr))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print(f"{n} expressions")
PY
promtool check rules "$work/dashboard-rules.yaml"

echo "-- alert rules parse and their unit tests pass"
promtool check rules deploy/prometheus/cairn-rules.yaml
(cd deploy/prometheus && promtool test rules cairn-rules.test.yaml)

echo "-- dashboard validates against @grafana/schema@$GRAFANA_SCHEMA_VERSION"
(cd "$work" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund \
  "@grafana/schema@$GRAFANA_SCHEMA_VERSION" "ts-json-schema-generator@$TS_JSON_SCHEMA_GENERATOR_VERSION" >/dev/null)
(cd "$work" && npx --no-install ts-json-schema-generator --no-type-check \
  --path node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts \
  --type Dashboard -o dashboard.schema.json)
if ! command -v check-jsonschema >/dev/null 2>&1; then
  python3 -m pip install -q "check-jsonschema==$CHECK_JSONSCHEMA_VERSION" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi
check-jsonschema --schemafile "$work/dashboard.schema.json" deploy/grafana/cairn.json
