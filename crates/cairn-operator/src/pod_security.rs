//! The Pod Security Standards' "restricted" profile (Kubernetes 1.33, `latest`) as a pure
//! check of a pod spec, so that every pod Cairn ships (the data pods the operator builds,
//! the operator's own Deployment in the chart) is tested against the rules a namespace with
//! `pod-security.kubernetes.io/enforce: restricted` applies, without an API server that
//! implements admission (the test API server here predates it).
//!
//! Each rule names the field it looks at; a violation says where. The baseline rules the
//! profile includes are checked too (host namespaces, privileged, host paths and ports,
//! added capabilities, /proc mount, sysctls, SELinux, AppArmor).

use k8s_openapi::api::core::v1::{PodSpec, SeccompProfile, SecurityContext};

/// Volume types the restricted profile allows.
const ALLOWED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Sysctls the baseline profile calls safe.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types the baseline profile allows (besides none).
const SELINUX_TYPES: &[&str] = &["container_t", "container_init_t", "container_kvm_t"];

/// Every way `pod` breaks the restricted profile; empty when it would be admitted.
pub fn restricted_violations(pod: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (flag, name) in [
        (pod.host_network, "hostNetwork"),
        (pod.host_pid, "hostPID"),
        (pod.host_ipc, "hostIPC"),
    ] {
        if flag == Some(true) {
            out.push(format!("spec.{name} is true"));
        }
    }
    for volume in pod.volumes.iter().flatten() {
        let value = serde_json::to_value(volume).unwrap_or_default();
        let kinds: Vec<&String> = value
            .as_object()
            .map(|o| o.keys().filter(|k| *k != "name").collect())
            .unwrap_or_default();
        for kind in kinds {
            if !ALLOWED_VOLUMES.contains(&kind.as_str()) {
                out.push(format!("volume {} is of type {kind}", volume.name));
            }
        }
    }
    let pod_context = pod.security_context.as_ref();
    let pod_non_root = pod_context.and_then(|c| c.run_as_non_root) == Some(true);
    let pod_seccomp = pod_context.and_then(|c| c.seccomp_profile.as_ref());
    if let Some(context) = pod_context {
        if context.run_as_user == Some(0) {
            out.push("spec.securityContext.runAsUser is 0".into());
        }
        if context.run_as_non_root == Some(false) {
            out.push("spec.securityContext.runAsNonRoot is false".into());
        }
        if let Some(profile) = &context.seccomp_profile
            && !confined(profile)
        {
            out.push(format!(
                "spec.securityContext.seccompProfile.type is {}",
                profile.type_
            ));
        }
        for sysctl in context.sysctls.iter().flatten() {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                out.push(format!("spec.securityContext.sysctls sets {}", sysctl.name));
            }
        }
        if let Some(selinux) = &context.se_linux_options {
            selinux_violations("spec.securityContext", selinux, &mut out);
        }
        if let Some(apparmor) = &context.app_armor_profile
            && apparmor.type_ == "Unconfined"
        {
            out.push("spec.securityContext.appArmorProfile.type is Unconfined".into());
        }
    }
    let containers = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| (&c.name, c.security_context.as_ref(), c.ports.as_deref()))
        .chain(
            pod.containers
                .iter()
                .map(|c| (&c.name, c.security_context.as_ref(), c.ports.as_deref())),
        );
    for (name, context, ports) in containers {
        let at = format!("container {name}");
        for port in ports.unwrap_or_default() {
            if port.host_port.is_some_and(|p| p != 0) {
                out.push(format!(
                    "{at} uses hostPort {}",
                    port.host_port.unwrap_or(0)
                ));
            }
        }
        container_violations(&at, context, pod_non_root, pod_seccomp, &mut out);
    }
    out
}

fn container_violations(
    at: &str,
    context: Option<&SecurityContext>,
    pod_non_root: bool,
    pod_seccomp: Option<&SeccompProfile>,
    out: &mut Vec<String>,
) {
    let default = SecurityContext::default();
    let context = context.unwrap_or(&default);
    if context.privileged == Some(true) {
        out.push(format!("{at} is privileged"));
    }
    if context.allow_privilege_escalation != Some(false) {
        out.push(format!("{at} does not set allowPrivilegeEscalation: false"));
    }
    match context.run_as_non_root {
        Some(false) => out.push(format!("{at} sets runAsNonRoot: false")),
        None if !pod_non_root => out.push(format!("{at} may run as root (no runAsNonRoot)")),
        _ => {}
    }
    if context.run_as_user == Some(0) {
        out.push(format!("{at} sets runAsUser: 0"));
    }
    match context.seccomp_profile.as_ref().or(pod_seccomp) {
        Some(profile) if confined(profile) => {}
        Some(profile) => out.push(format!("{at} has seccomp profile {}", profile.type_)),
        None => out.push(format!(
            "{at} has no seccomp profile (RuntimeDefault or Localhost)"
        )),
    }
    let capabilities = context.capabilities.as_ref();
    let drops_all = capabilities
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        out.push(format!("{at} does not drop ALL capabilities"));
    }
    for added in capabilities
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
    {
        if added != "NET_BIND_SERVICE" {
            out.push(format!("{at} adds capability {added}"));
        }
    }
    if context
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        out.push(format!("{at} sets procMount"));
    }
    if let Some(selinux) = &context.se_linux_options {
        selinux_violations(at, selinux, out);
    }
    if let Some(apparmor) = &context.app_armor_profile
        && apparmor.type_ == "Unconfined"
    {
        out.push(format!("{at} has AppArmor profile Unconfined"));
    }
}

fn confined(profile: &SeccompProfile) -> bool {
    matches!(profile.type_.as_str(), "RuntimeDefault" | "Localhost")
}

fn selinux_violations(
    at: &str,
    options: &k8s_openapi::api::core::v1::SELinuxOptions,
    out: &mut Vec<String>,
) {
    if let Some(kind) = options.type_.as_deref()
        && !kind.is_empty()
        && !SELINUX_TYPES.contains(&kind)
    {
        out.push(format!("{at} sets SELinux type {kind}"));
    }
    if options.user.as_deref().is_some_and(|u| !u.is_empty())
        || options.role.as_deref().is_some_and(|r| !r.is_empty())
    {
        out.push(format!("{at} sets an SELinux user or role"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Capabilities, Container, ContainerPort, HostPathVolumeSource, PodSecurityContext, Volume,
    };

    fn hardened() -> PodSpec {
        PodSpec {
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(10001),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: "app".into(),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Capabilities::default()
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }
    }

    #[test]
    fn a_hardened_pod_passes() {
        assert_eq!(restricted_violations(&hardened()), Vec::<String>::new());
    }

    #[test]
    fn each_gap_is_named() {
        let mut pod = hardened();
        pod.security_context
            .as_mut()
            .expect("context")
            .seccomp_profile = None;
        assert_eq!(
            restricted_violations(&pod),
            ["container app has no seccomp profile (RuntimeDefault or Localhost)"]
        );

        let mut pod = hardened();
        let context = pod.containers[0]
            .security_context
            .as_mut()
            .expect("context");
        context.allow_privilege_escalation = None;
        context.capabilities = None;
        context.run_as_non_root = Some(false);
        assert_eq!(
            restricted_violations(&pod),
            [
                "container app does not set allowPrivilegeEscalation: false",
                "container app sets runAsNonRoot: false",
                "container app does not drop ALL capabilities",
            ]
        );

        let mut pod = hardened();
        pod.host_network = Some(true);
        pod.volumes = Some(vec![Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                ..HostPathVolumeSource::default()
            }),
            ..Volume::default()
        }]);
        pod.containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(80),
            ..ContainerPort::default()
        }]);
        pod.containers[0]
            .security_context
            .as_mut()
            .expect("context")
            .capabilities
            .as_mut()
            .expect("capabilities")
            .add = Some(vec!["NET_BIND_SERVICE".into(), "SYS_ADMIN".into()]);
        assert_eq!(
            restricted_violations(&pod),
            [
                "spec.hostNetwork is true",
                "volume host is of type hostPath",
                "container app uses hostPort 80",
                "container app adds capability SYS_ADMIN",
            ]
        );
    }

    #[test]
    fn a_container_without_any_context_breaks_every_container_rule() {
        let mut pod = hardened();
        pod.security_context = None;
        pod.containers[0].security_context = None;
        assert_eq!(restricted_violations(&pod).len(), 4);
    }
}
