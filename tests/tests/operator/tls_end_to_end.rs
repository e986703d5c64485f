//! A Boundary with `tls: {mode: operator}` becomes a three-pod TLS cluster of real `cairn`
//! processes: the operator makes its CA and the pods' certificates, the nodes speak mutual
//! TLS to each other and TLS to clients, and a client holding only the CA certificate from
//! `<name>-ca` writes and reads.

use std::time::Duration;

use cairn_operator::build;
use cairn_operator::certificates::{self, CA_CERT_KEY};
use cairn_operator::cluster_api::PeerTls;
use cairn_proto::orisun::event_store_client::EventStoreClient;
use cairn_tests::{Credentials, orisun as pb};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use super::end_to_end::{
    BOUNDARY, CLUSTER_WAIT, EventStore, KubeletCluster, active_with, agreed_leader_over,
    all_events, client_addr, in_private_network, secret_value,
};
use super::{NAMESPACE, eventually_within};

#[test]
#[ignore = "needs a real kube-apiserver (../shared/tools/k8s-envtest) and root (unshare -n, unshare -m); run by .ci/run with --ignored"]
fn a_tls_boundary_runs_as_a_tls_cluster_a_client_reaches_with_the_ca() {
    in_private_network(
        "tls_end_to_end::a_tls_boundary_runs_as_a_tls_cluster_a_client_reaches_with_the_ca",
        tls_boundary_runs_as_a_tls_cluster(),
    );
}

/// A client of pod `ip`'s client port over TLS, trusting `ca` and expecting the client
/// Service's name on the certificate.
pub(crate) fn tls_event_store(
    ip: std::net::Ipv4Addr,
    ca: &str,
    credentials: &Credentials,
) -> EventStore {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(format!("{BOUNDARY}.{NAMESPACE}.svc"));
    let channel = Channel::from_shared(format!("https://{}", client_addr(ip)))
        .expect("uri")
        .tls_config(tls)
        .expect("TLS")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    EventStoreClient::with_interceptor(channel, credentials.clone())
}

async fn tls_boundary_runs_as_a_tls_cluster() {
    let cluster = KubeletCluster::start().await;
    let (client, kubelet) = (&cluster.client, &cluster.kubelet);
    let boundaries = cluster
        .create_boundary(serde_json::json!({
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "tls": {"mode": "operator"},
        }))
        .await;

    // Active with a leader: the operator reached the pods' peer ports over mutual TLS.
    let status = active_with(&boundaries, &[1, 2, 3]).await;
    assert_eq!(status.ready_replicas, 3);

    // The Secrets: the CA's key apart, its certificate for clients, and the pods' files.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let ca = secret_value(
        &secrets,
        &certificates::ca_secret_name(BOUNDARY),
        CA_CERT_KEY,
    )
    .await;
    let public = secrets
        .get(&certificates::ca_secret_name(BOUNDARY))
        .await
        .expect("the CA Secret");
    assert_eq!(
        public.data.expect("data").keys().collect::<Vec<_>>(),
        [CA_CERT_KEY],
        "clients get the CA's certificate and nothing else"
    );
    let pods_files = secrets
        .get(&certificates::tls_secret_name(BOUNDARY))
        .await
        .expect("the TLS Secret")
        .data
        .expect("data");
    for ordinal in 0..3 {
        let pod = format!("{BOUNDARY}-{ordinal}");
        let cert = &pods_files[&certificates::cert_key(&pod)].0;
        assert!(
            certificates::not_after(cert).is_some(),
            "{pod}'s certificate"
        );
        assert!(pods_files.contains_key(&certificates::key_key(&pod)));
    }
    let config = build::config_map_name(BOUNDARY);
    let config =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .get(&config)
            .await
            .expect("the ConfigMap")
            .data
            .expect("data");
    assert!(!config.contains_key("CAIRN_ALLOW_PLAINTEXT_PEERS"));

    // Every node agrees on the leader when asked with a certificate of the Boundary's CA.
    let authority = certificates::Authority::from_pem(
        &secret_value(
            &secrets,
            &certificates::ca_key_secret_name(BOUNDARY),
            certificates::CA_KEY_CERT,
        )
        .await,
        &secret_value(
            &secrets,
            &certificates::ca_key_secret_name(BOUNDARY),
            certificates::CA_KEY_KEY,
        )
        .await,
    )
    .expect("the stored CA");
    let (cert_pem, key_pem) = authority
        .issue(&["the-test".to_string()], now())
        .expect("a client certificate");
    let peer_tls = PeerTls {
        ca_pem: ca.clone(),
        cert_pem,
        key_pem,
    };
    let cluster_secret = secret_value(
        &secrets,
        &build::cluster_secret_name(BOUNDARY),
        build::CLUSTER_SECRET_KEY,
    )
    .await;
    let leader = agreed_leader_over(kubelet, &cluster_secret, Some(&peer_tls), &[1, 2, 3]).await;
    assert_eq!(status.leader, Some(build::pod_name(BOUNDARY, leader)));

    // A client with the CA writes through one pod and reads through another.
    let credentials = Credentials::basic(
        "admin",
        &secret_value(&secrets, &format!("{BOUNDARY}-admin"), "password").await,
    );
    let ips: Vec<_> = {
        let mut ips = Vec::new();
        for id in 1..=3 {
            ips.push(
                kubelet
                    .ip(&build::pod_name(BOUNDARY, id))
                    .await
                    .expect("pod IP"),
            );
        }
        ips
    };
    let mut first = tls_event_store(ips[0], &ca, &credentials);
    let written = eventually_within("a write over TLS", CLUSTER_WAIT, || {
        let mut first = first.clone();
        async move {
            first
                .save_events_v2(pb::SaveEventsV2Request {
                    boundary: BOUNDARY.into(),
                    events: vec![cairn_tests::event("Hello", r#"{"over":"tls"}"#)],
                    consistency: vec![],
                })
                .await
                .ok()
        }
    })
    .await;
    assert!(written.into_inner().log_position.is_some());
    let mut other = tls_event_store(ips[2], &ca, &credentials);
    assert_eq!(
        all_events(&mut other).await.len(),
        1,
        "another node reads it"
    );

    // Plaintext gets nowhere, on the client port or the peer port.
    let plaintext = Channel::from_shared(format!("http://{}", client_addr(ips[1])))
        .expect("uri")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    EventStoreClient::with_interceptor(plaintext, credentials.clone())
        .ping(pb::PingRequest {})
        .await
        .expect_err("plaintext to a TLS client port");
    let peer = format!("http://{}:{}", ips[1], build::PEER_PORT);
    let plaintext = Channel::from_shared(peer).expect("uri").connect_lazy();
    cairn_proto::cairn_v1::cluster_client::ClusterClient::new(plaintext)
        .status(cairn_proto::cairn_v1::StatusRequest {})
        .await
        .expect_err("plaintext to a peer port");

    // Certificates of the pods that run are not reissued on every pass.
    first = tls_event_store(ips[0], &ca, &credentials);
    assert_eq!(all_events(&mut first).await.len(), 1);
    let again = secrets
        .get(&certificates::tls_secret_name(BOUNDARY))
        .await
        .expect("the TLS Secret")
        .data
        .expect("data");
    assert_eq!(again, pods_files, "a settled Boundary's certificates stay");
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
