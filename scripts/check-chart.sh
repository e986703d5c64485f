#!/usr/bin/env bash
# Static checks of the Helm chart (run by .ci/run):
#  1. the chart's copies of the CRD, dashboard and alert rules are the files in deploy/;
#  2. `helm lint --strict`;
#  3. the rendered chart (every optional part on, CRDs included) validates against
#     Kubernetes 1.33's schemas with unknown fields rejected (kubernetes-validate --strict);
#  4. values.schema.json rejects bad values (a negative case per kind of mistake).
# Needs ../shared/tools (helm, kubernetes-validate) or CAIRN_SHARED_TOOLS.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${CAIRN_SHARED_TOOLS:-../shared/tools}

echo "-- the chart's copies match deploy/"
for pair in "deploy/crds/boundaries.cairn.dev.yaml charts/cairn/crds/boundaries.cairn.dev.yaml" \
            "deploy/grafana/cairn.json charts/cairn/files/cairn.json" \
            "deploy/prometheus/cairn-rules.yaml charts/cairn/files/cairn-rules.yaml"; do
  set -- $pair
  if ! cmp -s "$1" "$2"; then
    echo "$2 differs from $1: cp $1 $2" >&2
    exit 1
  fi
done

echo "-- helm lint --strict"
"$tools/helm" lint --strict charts/cairn

echo "-- rendered manifests validate against Kubernetes 1.33 (strict)"
"$tools/helm" template cairn charts/cairn --namespace cairn-system --include-crds \
  --set monitoring.dashboard=true \
  --set 'boundaries[0].name=orders' --set 'boundaries[0].spec.replicas=3' \
  | "$tools/kubernetes-validate" --strict -k 1.33.0 -

echo "-- values.schema.json accepts both TLS modes"
"$tools/helm" template cairn charts/cairn --set 'boundaries[0].name=a' \
  --set 'boundaries[0].spec.tls.mode=operator' >/dev/null
"$tools/helm" template cairn charts/cairn --set 'boundaries[0].name=a' \
  --set 'boundaries[0].spec.tls.mode=certManager' \
  --set 'boundaries[0].spec.tls.issuerRef.name=ca' >/dev/null

echo "-- values.schema.json rejects bad values"
for bad in "operator.logLevel=loud" "boundaries[0].name=Orders" "boundaries[0].spec.replicas=4" \
           "operator.image.pullPolicy=Sometimes" "operator.replicas=0" "unknownValue=1" \
           "boundaries[0].name=a,boundaries[0].spec.tls.mode=vault" \
           "boundaries[0].name=a,boundaries[0].spec.tls.mode=certManager" \
           "boundaries[0].name=a,boundaries[0].spec.tls.mode=operator,boundaries[0].spec.tls.issuerRef.name=ca"; do
  if "$tools/helm" template cairn charts/cairn --set "$bad" >/dev/null 2>&1; then
    echo "values.schema.json accepted --set $bad" >&2
    exit 1
  fi
  echo "refused: --set $bad"
done
echo "chart checks passed"
