//! The Helm chart on a real API server: `helm install`, the operator's RBAC checked verb by
//! verb with `kubectl auth can-i --as` the chart's ServiceAccount, a whole reconcile run with
//! that ServiceAccount's own token, `helm upgrade`, `helm uninstall`.

use std::path::Path;
use std::process::Command;

use cairn_operator::Boundary;
use cairn_operator::leader::{
    DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD, LeaseConfig,
};
use cairn_operator::serve::{self, RunOptions};
use cairn_operator::validate::{OperatorDefaults, OperatorPods};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::{
    Envtest, NAMESPACE, boundaries_raw, create_namespace, delete_and_wait, eventually, http_get,
    manifest, metric, shared_tools,
};

const RELEASE_NAMESPACE: &str = "cairn-system";
/// The chart's ServiceAccount for release `cairn`.
const OPERATOR: &str = "system:serviceaccount:cairn-system:cairn";

/// (verb, resource) the reconcile uses; the ServiceAccount must be allowed each.
const NEEDED: &[(&str, &str)] = &[
    ("get", "boundaries.cairn.dev"),
    ("list", "boundaries.cairn.dev"),
    ("watch", "boundaries.cairn.dev"),
    ("patch", "boundaries.cairn.dev"),
    ("patch", "boundaries.cairn.dev/status"),
    ("update", "boundaries.cairn.dev/finalizers"),
    ("get", "configmaps"),
    ("create", "configmaps"),
    ("patch", "configmaps"),
    ("get", "services"),
    ("patch", "services"),
    ("get", "secrets"),
    ("create", "secrets"),
    ("list", "pods"),
    ("list", "persistentvolumeclaims"),
    ("patch", "persistentvolumeclaims"),
    ("delete", "persistentvolumeclaims"),
    ("deletecollection", "persistentvolumeclaims"),
    ("get", "statefulsets.apps"),
    ("list", "statefulsets.apps"),
    ("watch", "statefulsets.apps"),
    ("patch", "statefulsets.apps"),
    ("get", "poddisruptionbudgets.policy"),
    ("patch", "poddisruptionbudgets.policy"),
    ("create", "networkpolicies.networking.k8s.io"),
    ("patch", "networkpolicies.networking.k8s.io"),
    // (ServiceMonitors too, but kubectl cannot ask about a resource the server does not
    // serve, and this one has no Prometheus operator.)
    ("create", "events.events.k8s.io"),
];

/// What it must not be able to do.
const REFUSED: &[(&str, &str)] = &[
    ("list", "secrets"),
    ("update", "secrets"),
    ("delete", "secrets"),
    ("create", "pods"),
    ("delete", "pods"),
    ("patch", "pods"),
    ("delete", "statefulsets.apps"),
    ("delete", "boundaries.cairn.dev"),
    ("delete", "configmaps"),
    ("get", "nodes"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest) and Helm (../shared/tools/helm); run by .ci/run with --ignored"]
async fn the_chart_installs_upgrades_and_uninstalls_on_a_real_api_server() {
    let envtest = Envtest::start();
    let client = envtest.client().await;
    let kubeconfig = envtest.kubeconfig();
    let chart = cairn_tests::repo_root().join("charts/cairn");
    let chart = chart.to_str().expect("utf-8 path");

    let installed = helm(
        &kubeconfig,
        &[
            "install",
            "cairn",
            chart,
            "-n",
            RELEASE_NAMESPACE,
            "--create-namespace",
        ],
    );
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    super::established(&crds, "boundaries.cairn.dev").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let deployment = deployments
        .get("cairn")
        .await
        .expect("the operator Deployment");
    let template = deployment.spec.expect("spec").template;
    let operator_labels = template
        .metadata
        .and_then(|m| m.labels)
        .expect("operator pod labels");
    let pod = template.spec.expect("pod");
    // The NetworkPolicies the operator makes must select the operator's pods as the chart
    // labels them.
    let env = |name: &str| {
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(
        env("CAIRN_OPERATOR_NETWORK_POLICY").as_deref(),
        Some("true")
    );
    let advertised: std::collections::BTreeMap<String, String> = env("CAIRN_OPERATOR_POD_LABELS")
        .expect("pod labels passed to the operator")
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(
        advertised
            .iter()
            .all(|(k, v)| operator_labels.get(k) == Some(v)),
        "{advertised:?} does not select {operator_labels:?}"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("cairn"));
    assert_eq!(
        pod.containers[0].args.as_deref(),
        Some(&["run".to_string()][..])
    );
    assert_eq!(
        cairn_operator::pod_security::restricted_violations(&pod),
        Vec::<String>::new(),
        "the operator's pod, as the API server stored it, must pass PSS restricted"
    );

    // RBAC, as the API server decides it for the chart's ServiceAccount.
    for (verb, resource) in NEEDED {
        assert!(
            can_i(&kubeconfig, verb, resource),
            "the operator needs {verb} {resource}"
        );
    }
    for (verb, resource) in REFUSED {
        assert!(
            !can_i(&kubeconfig, verb, resource),
            "the operator must not {verb} {resource}"
        );
    }
    // Leader election: its own Lease in its own namespace, nothing else.
    for verb in ["get", "update"] {
        assert!(
            can_i_in(
                &kubeconfig,
                RELEASE_NAMESPACE,
                verb,
                "leases.coordination.k8s.io/cairn"
            ),
            "the operator needs {verb} on its Lease"
        );
        assert!(
            !can_i_in(
                &kubeconfig,
                RELEASE_NAMESPACE,
                verb,
                "leases.coordination.k8s.io/kube-controller-manager"
            ),
            "the operator must not {verb} another Lease"
        );
    }
    assert!(can_i_in(
        &kubeconfig,
        RELEASE_NAMESPACE,
        "create",
        "leases.coordination.k8s.io"
    ));
    assert!(!can_i_in(
        &kubeconfig,
        NAMESPACE,
        "create",
        "leases.coordination.k8s.io"
    ));
    assert!(!can_i_in(
        &kubeconfig,
        RELEASE_NAMESPACE,
        "delete",
        "leases.coordination.k8s.io/cairn"
    ));

    // The whole operator process (leader election on the chart's Lease, HTTP side port,
    // reconciles) with the ServiceAccount's own token: create, status, clean deletion.
    let operator_client = service_account_client(&client, &envtest).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = listener.local_addr().expect("address");
    let shutdown = CancellationToken::new();
    let operator = tokio::spawn(serve::run(
        operator_client,
        RunOptions {
            defaults: OperatorDefaults {
                image: "cairn:test".into(),
                network_policy: Some(OperatorPods {
                    namespace: RELEASE_NAMESPACE.into(),
                    labels: advertised.clone(),
                }),
            },
            namespace: None,
            election: Some(LeaseConfig {
                name: "cairn".into(),
                namespace: RELEASE_NAMESPACE.into(),
                identity: "cairn-operator-test".into(),
                lease_duration: DEFAULT_LEASE_DURATION,
                renew_deadline: DEFAULT_RENEW_DEADLINE,
                retry_period: DEFAULT_RETRY_PERIOD,
            }),
        },
        listener,
        shutdown.clone(),
    ));
    let leases: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    eventually("the operator to hold the chart's Lease", || {
        let leases = leases.clone();
        async move {
            let holder = leases.get("cairn").await.ok()?.spec?.holder_identity?;
            (holder == "cairn-operator-test").then_some(())
        }
    })
    .await;
    create_namespace(&client).await;
    boundaries_raw(&client)
        .create(
            &PostParams::default(),
            &manifest(
                "orders",
                serde_json::json!({"replicas": 3, "volumeReclaimPolicy": "Delete"}),
            ),
        )
        .await
        .expect("create a Boundary");
    let boundaries: Api<Boundary> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("the status, written by the ServiceAccount", || {
        let boundaries = boundaries.clone();
        async move { boundaries.get("orders").await.ok()?.status?.phase }
    })
    .await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let set = sets
        .get_opt("orders")
        .await
        .expect("read")
        .expect("the operator made the StatefulSet");
    let data_pod = set.spec.expect("spec").template.spec.expect("pod");
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), NAMESPACE);
    let policy = policies
        .get_opt("orders")
        .await
        .expect("read")
        .expect("the operator (as its ServiceAccount) made the NetworkPolicy");
    let peer_sources = policy.spec.and_then(|s| s.ingress).expect("rules")[0]
        .from
        .clone()
        .expect("peer sources");
    assert_eq!(
        peer_sources[1]
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone()),
        Some(advertised.clone())
    );
    assert_eq!(
        cairn_operator::pod_security::restricted_violations(&data_pod),
        Vec::<String>::new(),
        "data pods, as the API server stored them, must pass PSS restricted"
    );
    delete_and_wait(&boundaries, "orders").await;
    let metrics = http_get(http, "/metrics").await;
    assert!(metrics.contains("cairn_operator_leader 1"), "{metrics}");
    assert_eq!(
        metric(
            &metrics,
            "cairn_operator_reconcile_errors_total{reason=\"apply\"}"
        ),
        0.0
    );
    assert!(
        metric(&metrics, "cairn_operator_reconciles_total") >= 2.0,
        "{metrics}"
    );
    assert_eq!(http_get(http, "/healthz").await, "ok\n");
    shutdown.cancel();
    operator
        .await
        .expect("operator task")
        .expect("a clean stop");
    let released = leases
        .get("cairn")
        .await
        .expect("the Lease")
        .spec
        .expect("spec");
    assert_eq!(released.holder_identity, None, "released on a clean stop");

    assert!(
        can_i_in(&kubeconfig, "elsewhere", "get", "secrets"),
        "unscoped, the operator serves Boundaries in every namespace"
    );
    // Upgrade: a changed value reaches the Deployment. Scoped to one namespace, the
    // operator's rights become a Role there: nothing in any other namespace.
    let upgraded = helm(
        &kubeconfig,
        &[
            "upgrade",
            "cairn",
            chart,
            "-n",
            RELEASE_NAMESPACE,
            "--set",
            "operator.logLevel=debug",
            "--set",
            &format!("operator.watchNamespace={NAMESPACE}"),
        ],
    );
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    for (verb, resource) in NEEDED {
        assert!(
            can_i(&kubeconfig, verb, resource),
            "scoped, the operator still needs {verb} {resource} in {NAMESPACE}"
        );
    }
    for (verb, resource) in [
        ("get", "secrets"),
        ("create", "secrets"),
        ("delete", "persistentvolumeclaims"),
        ("deletecollection", "persistentvolumeclaims"),
        ("patch", "statefulsets.apps"),
        ("list", "boundaries.cairn.dev"),
    ] {
        assert!(
            !can_i_in(&kubeconfig, "elsewhere", verb, resource),
            "scoped to {NAMESPACE}, the operator must not {verb} {resource} in elsewhere"
        );
    }
    let deployment = deployments.get("cairn").await.expect("Deployment");
    let env = deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod")
        .containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "CAIRN_OPERATOR_LOG" && e.value.as_deref() == Some("debug")),
        "{env:?}"
    );

    // Uninstall: the operator and its RBAC go; the CRD (and so any Boundary) stays.
    helm(
        &kubeconfig,
        &["uninstall", "cairn", "-n", RELEASE_NAMESPACE],
    );
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    eventually("the release's objects to go", || {
        let (deployments, roles, accounts) = (deployments.clone(), roles.clone(), accounts.clone());
        async move {
            let gone = deployments.get_opt("cairn").await.ok()?.is_none()
                && roles.get_opt("cairn").await.ok()?.is_none()
                && accounts.get_opt("cairn").await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await;
    assert!(
        crds.get_opt("boundaries.cairn.dev")
            .await
            .expect("read")
            .is_some(),
        "Helm leaves CRDs in place"
    );
}

fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    let output = Command::new(shared_tools().join("helm"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run helm");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "helm {args:?} failed:\n{text}");
    text
}

/// `kubectl auth can-i VERB RESOURCE -n shop --as OPERATOR` (the kubectl Helm's tool ships).
fn can_i(kubeconfig: &Path, verb: &str, resource: &str) -> bool {
    can_i_in(kubeconfig, NAMESPACE, verb, resource)
}

/// `kubectl auth can-i VERB RESOURCE -n NAMESPACE --as OPERATOR`.
fn can_i_in(kubeconfig: &Path, namespace: &str, verb: &str, resource: &str) -> bool {
    let output = Command::new(shared_tools().join("helm"))
        .args(["--kubectl", "auth", "can-i", verb, resource])
        .args(["-n", namespace, "--as", OPERATOR])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl");
    let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {verb} {resource}: {other:?} {}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// A client authenticated as the chart's ServiceAccount, with the token Kubernetes 1.20's
/// token controller put in its Secret.
async fn service_account_client(admin: &Client, envtest: &Envtest) -> Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), RELEASE_NAMESPACE);
    let secret_name = eventually("the ServiceAccount's token Secret", || {
        let accounts = accounts.clone();
        async move {
            accounts
                .get("cairn")
                .await
                .ok()?
                .secrets?
                .first()?
                .name
                .clone()
        }
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), RELEASE_NAMESPACE);
    let token = eventually("the token", || {
        let (secrets, secret_name) = (secrets.clone(), secret_name.clone());
        async move {
            let bytes = secrets
                .get(&secret_name)
                .await
                .ok()?
                .data?
                .remove("token")?;
            String::from_utf8(bytes.0).ok()
        }
    })
    .await;
    let mut kubeconfig = Kubeconfig::read_from(envtest.kubeconfig()).expect("kubeconfig");
    for user in &mut kubeconfig.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.token = Some(token.clone().into());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}
