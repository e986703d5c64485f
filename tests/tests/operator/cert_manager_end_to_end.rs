//! A Boundary with `tls: {mode: certManager, issuerRef}` becomes a three-pod TLS cluster of
//! real `cairn` processes whose certificates cert-manager issued. cert-manager does not run
//! here: its `Certificate` kind is installed (`fixtures/cert-manager-certificates.json`, the
//! fields the operator sets, typed as cert-manager types them) and the test plays its
//! controller, filling each Certificate's Secret (`tls.crt`, `tls.key`, `ca.crt`) from a CA
//! of its own, as a CA issuer would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_operator::build;
use cairn_operator::cert_manager;
use cairn_operator::certificates::{self, Authority, CA_CERT_KEY};
use cairn_tests::{Credentials, orisun as pb};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::end_to_end::{
    BOUNDARY, CLUSTER_WAIT, KubeletCluster, active_with, all_events, in_private_network,
    secret_value,
};
use super::tls_end_to_end::tls_event_store;
use super::{NAMESPACE, condition_with, eventually, eventually_within, poke};

#[test]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest) and root (unshare -n, unshare -m); run by .ci/run with --ignored"]
fn a_boundary_with_cert_manager_certificates_runs_as_a_tls_cluster() {
    in_private_network(
        "cert_manager_end_to_end::a_boundary_with_cert_manager_certificates_runs_as_a_tls_cluster",
        cert_manager_boundary(),
    );
}

fn certificates_api(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(&cert_manager::gvk(), cert_manager::PLURAL),
    )
}

async fn install_certificate_crd(client: &Client) {
    let crd: CustomResourceDefinition =
        serde_json::from_str(include_str!("fixtures/cert-manager-certificates.json"))
            .expect("the Certificate CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd)
        .await
        .expect("install the Certificate CRD");
    super::established(&crds, "certificates.cert-manager.io").await;
}

/// What cert-manager's controller does for a CA issuer: the Secret `spec.secretName` with a
/// certificate for `spec.dnsNames` from `authority`, its key, and the CA.
async fn issue(secrets: &Api<Secret>, certificate: &DynamicObject, authority: &Authority) {
    let spec = &certificate.data["spec"];
    let names: Vec<String> =
        serde_json::from_value(spec["dnsNames"].clone()).expect("the Certificate's dnsNames");
    let (cert, key) = authority
        .issue(&names, now())
        .expect("issue the certificate");
    let secret_name = spec["secretName"].as_str().expect("secretName");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(secret_name.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".into(), ByteString(cert.into_bytes())),
            ("tls.key".into(), ByteString(key.into_bytes())),
            (
                CA_CERT_KEY.into(),
                ByteString(authority.cert_pem.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    secrets
        .patch(
            secret_name,
            &PatchParams::apply("test-cert-manager").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("write the issued Secret");
}

/// The test's cert-manager: fills the Secret of every Certificate that has none, except
/// those named in `withheld`.
async fn play_cert_manager(
    client: Client,
    authority: Arc<Authority>,
    withheld: tokio::sync::watch::Receiver<Vec<String>>,
) {
    let certificates = certificates_api(&client);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    loop {
        if let Ok(list) = certificates.list(&ListParams::default()).await {
            for certificate in list.items {
                let name = certificate.metadata.name.clone().unwrap_or_default();
                let secret_name = certificate.data["spec"]["secretName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if withheld.borrow().contains(&name)
                    || matches!(secrets.get_opt(&secret_name).await, Ok(Some(_)))
                {
                    continue;
                }
                issue(&secrets, &certificate, &authority).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cert_manager_boundary() {
    let cluster = KubeletCluster::start_with(install_certificate_crd).await;
    let (client, kubelet) = (&cluster.client, &cluster.kubelet);
    let boundaries = cluster
        .create_boundary(serde_json::json!({
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "tls": {"mode": "certManager", "issuerRef": {"name": "shop-ca", "kind": "ClusterIssuer"}},
        }))
        .await;

    // The operator asks for a certificate per pod and one for itself, with the names the
    // pods answer to, from the issuer the spec names (read back: nothing was pruned).
    let certificates = certificates_api(client);
    let wanted: Vec<String> = (0..3)
        .map(|ordinal| cert_manager::pod_certificate_name(BOUNDARY, ordinal))
        .chain([cert_manager::operator_certificate_name(BOUNDARY)])
        .collect();
    for name in &wanted {
        let certificate = eventually(&format!("Certificate {name}"), || {
            let certificates = certificates.clone();
            async move { certificates.get(name).await.ok() }
        })
        .await;
        let spec = &certificate.data["spec"];
        assert_eq!(spec["secretName"], name.as_str());
        assert_eq!(
            spec["issuerRef"],
            serde_json::json!({"name": "shop-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
        assert_eq!(spec["privateKey"]["encoding"], "PKCS8");
        assert!(
            spec["usages"]
                .as_array()
                .is_some_and(|u| u.contains(&"client auth".into()))
        );
    }
    let pod_1 = certificates
        .get(&cert_manager::pod_certificate_name(BOUNDARY, 1))
        .await
        .expect("pod 1's Certificate");
    let names: Vec<String> =
        serde_json::from_value(pod_1.data["spec"]["dnsNames"].clone()).expect("dnsNames");
    assert_eq!(names, certificates::pod_names(BOUNDARY, NAMESPACE, 1));

    // Nothing issued yet: no pod runs, and the status says what it waits for.
    let waiting = condition_with(
        &boundaries,
        BOUNDARY,
        "Progressing",
        "WaitingForCertificates",
    )
    .await;
    assert!(
        waiting.message.contains("cert-manager"),
        "{}",
        waiting.message
    );
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let replicas = |set: Option<StatefulSet>| set.and_then(|s| s.spec?.replicas);
    assert_eq!(
        replicas(sets.get_opt(BOUNDARY).await.expect("read the StatefulSet")).unwrap_or(0),
        0,
        "no pod starts without its certificate"
    );
    assert!(kubelet.running().await.is_empty());

    // cert-manager issues everything but pod 2's: two pods run, and the status names the
    // one missing.
    let authority = Arc::new(Authority::generate("test-issuer", NAMESPACE, now()).expect("CA"));
    let withhold = cert_manager::pod_certificate_name(BOUNDARY, 2);
    let (withheld, withheld_rx) = tokio::sync::watch::channel(vec![withhold.clone()]);
    let cert_manager_task = tokio::spawn(play_cert_manager(
        client.clone(),
        authority.clone(),
        withheld_rx,
    ));
    eventually_within(
        "the StatefulSet to run the two issued pods",
        CLUSTER_WAIT,
        || {
            let sets = sets.clone();
            async move { (replicas(sets.get_opt(BOUNDARY).await.ok()?) == Some(2)).then_some(()) }
        },
    )
    .await;
    // The StatefulSet is written before the status in one pass: poll until the status
    // names what is still awaited (it said orders-0-cert before anything was issued).
    eventually("the status to name the withheld certificate", || {
        let (boundaries, withhold) = (&boundaries, &withhold);
        async move {
            let waiting = condition_with(
                boundaries,
                BOUNDARY,
                "Progressing",
                "WaitingForCertificates",
            )
            .await;
            waiting.message.contains(withhold.as_str()).then_some(())
        }
    })
    .await;

    // Pod 2's certificate arrives: Active with three voters, reached over mutual TLS.
    withheld.send_replace(Vec::new());
    let status = active_with(&boundaries, &[1, 2, 3]).await;
    assert_eq!(status.ready_replicas, 3);

    // The pods' Secret holds each pod's issued files and the issuer's CA.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let tls_name = certificates::tls_secret_name(BOUNDARY);
    let gathered = secrets
        .get(&tls_name)
        .await
        .expect("the TLS Secret")
        .data
        .expect("data");
    for ordinal in 0..3 {
        let issued = secrets
            .get(&cert_manager::pod_certificate_name(BOUNDARY, ordinal))
            .await
            .expect("the issued Secret")
            .data
            .expect("data");
        let pod = format!("{BOUNDARY}-{ordinal}");
        assert_eq!(gathered[&certificates::cert_key(&pod)], issued["tls.crt"]);
        assert_eq!(gathered[&certificates::key_key(&pod)], issued["tls.key"]);
    }
    assert_eq!(gathered[CA_CERT_KEY].0, authority.cert_pem.as_bytes());

    // A client trusting the issuer's CA writes through one pod and reads through another.
    let credentials = Credentials::basic(
        "admin",
        &secret_value(&secrets, &format!("{BOUNDARY}-admin"), "password").await,
    );
    let mut ips = Vec::new();
    for id in 1..=3 {
        ips.push(
            kubelet
                .ip(&build::pod_name(BOUNDARY, id))
                .await
                .expect("pod IP"),
        );
    }
    let first = tls_event_store(ips[0], &authority.cert_pem, &credentials);
    let written = eventually_within("a write over TLS", CLUSTER_WAIT, || {
        let mut first = first.clone();
        async move {
            first
                .save_events_v2(pb::SaveEventsV2Request {
                    boundary: BOUNDARY.into(),
                    events: vec![cairn_tests::event("Issued", r#"{"by":"cert-manager"}"#)],
                    consistency: vec![],
                })
                .await
                .ok()
        }
    })
    .await;
    assert!(written.into_inner().log_position.is_some());
    let mut other = tls_event_store(ips[2], &authority.cert_pem, &credentials);
    assert_eq!(
        all_events(&mut other).await.len(),
        1,
        "another node reads it"
    );

    // cert-manager renews pod 0's certificate: the operator copies it to the pods' Secret.
    let renewed_from = cert_manager::pod_certificate_name(BOUNDARY, 0);
    issue(
        &secrets,
        &certificates
            .get(&renewed_from)
            .await
            .expect("pod 0's Certificate"),
        &authority,
    )
    .await;
    let renewed = secrets
        .get(&renewed_from)
        .await
        .expect("the renewed Secret")
        .data
        .expect("data")["tls.crt"]
        .clone();
    assert_ne!(
        renewed,
        gathered[&certificates::cert_key(&format!("{BOUNDARY}-0"))]
    );
    poke(client, BOUNDARY).await;
    eventually_within(
        "the renewal to reach the pods' Secret",
        CLUSTER_WAIT,
        || {
            let secrets = secrets.clone();
            let (tls_name, renewed) = (tls_name.clone(), renewed.clone());
            async move {
                let data = secrets.get(&tls_name).await.ok()?.data?;
                (data.get(&certificates::cert_key(&format!("{BOUNDARY}-0"))) == Some(&renewed))
                    .then_some(())
            }
        },
    )
    .await;
    cert_manager_task.abort();
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
