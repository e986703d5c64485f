//! Every gRPC method the client port serves, with who may call it (A1, A3).
//!
//! The auth layer and the request metrics both read this one table, and a test holds it
//! equal to the methods of the descriptors the port serves, so a new RPC cannot be added
//! without deciding who may call it.

use cairn_core::auth::Role;

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credentials needed: health, and reflection (the schema is the public Orisun
    /// protocol; grpcurl needs reflection even to call the health service).
    Public,
    /// Any authenticated user.
    AnyUser,
    /// An authenticated user holding one of these roles.
    Roles(&'static [Role]),
}

/// A served method: its path (`/package.Service/Method`) and who may call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Method {
    /// Request path.
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
}

const WRITERS: Access = Access::Roles(&[Role::Admin, Role::Operations]);
const ADMINS: Access = Access::Roles(&[Role::Admin]);

const fn method(path: &'static str, access: Access) -> Method {
    Method { path, access }
}

/// The methods of the client port.
pub const METHODS: &[Method] = &[
    method("/orisun.EventStore/SaveEvents", WRITERS),
    method("/orisun.EventStore/SaveEventsV2", WRITERS),
    method("/orisun.EventStore/GetWriteContext", Access::AnyUser),
    method("/orisun.EventStore/GetEvents", Access::AnyUser),
    method("/orisun.EventStore/GetLatestByCriteria", Access::AnyUser),
    method(
        "/orisun.EventStore/CatchUpSubscribeToEvents",
        Access::AnyUser,
    ),
    method("/orisun.EventStore/Ping", Access::AnyUser),
    method("/orisun.EventStore/GetServerInfo", Access::AnyUser),
    method("/orisun.EventStore/CreateIndex", ADMINS),
    method("/orisun.EventStore/DropIndex", ADMINS),
    method("/orisun.EventStore/ListIndexes", WRITERS),
    method("/orisun.EventStore/GetIndex", WRITERS),
    method("/orisun.Admin/CreateBoundary", ADMINS),
    method("/orisun.Admin/ListBoundaries", Access::AnyUser),
    method("/orisun.Admin/GetBoundary", Access::AnyUser),
    method("/orisun.Admin/CreateUser", ADMINS),
    method("/orisun.Admin/DeleteUser", ADMINS),
    method("/orisun.Admin/ChangePassword", Access::AnyUser),
    method("/orisun.Admin/ListUsers", ADMINS),
    method("/orisun.Admin/ValidateCredentials", ADMINS),
    method("/orisun.Admin/GetUserCount", ADMINS),
    method("/orisun.Admin/GetEventCount", Access::AnyUser),
    method("/cairn.v1.Boundaries/CreateBoundary", ADMINS),
    method("/cairn.v1.Boundaries/GetBoundary", Access::AnyUser),
    method("/cairn.v1.Boundaries/ListBoundaries", Access::AnyUser),
    method("/cairn.v1.Tokens/RotateKey", ADMINS),
    method("/cairn.v1.Tokens/KeyStatus", ADMINS),
    method("/cairn.v1.Backup/Create", ADMINS),
    method("/grpc.health.v1.Health/Check", Access::Public),
    method("/grpc.health.v1.Health/Watch", Access::Public),
    method(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        Access::Public,
    ),
    method(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        Access::Public,
    ),
];

/// The served method at `path`, if any.
pub fn lookup(path: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.path == path)
}

/// The descriptor sets the client port serves (and its reflection describes).
pub fn served_descriptor_sets() -> [&'static [u8]; 6] {
    [
        cairn_proto::ORISUN_FILE_DESCRIPTOR_SET,
        cairn_proto::CAIRN_CLIENT_FILE_DESCRIPTOR_SET,
        cairn_proto::ERROR_DETAILS_FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost::Message;

    use super::*;

    #[test]
    fn the_table_lists_exactly_the_served_methods() {
        let mut described = BTreeSet::new();
        for encoded in served_descriptor_sets() {
            let set = prost_types::FileDescriptorSet::decode(encoded).expect("descriptor set");
            for file in &set.file {
                for service in &file.service {
                    for m in &service.method {
                        described.insert(format!(
                            "/{}.{}/{}",
                            file.package(),
                            service.name(),
                            m.name()
                        ));
                    }
                }
            }
        }
        let listed: BTreeSet<String> = METHODS.iter().map(|m| m.path.to_string()).collect();
        assert_eq!(listed.len(), METHODS.len(), "no method is listed twice");
        assert_eq!(listed, described);
    }

    #[test]
    fn only_health_and_reflection_are_public() {
        for m in METHODS {
            let public = m.path.starts_with("/grpc.health.v1.Health/")
                || m.path.starts_with("/grpc.reflection.");
            assert_eq!(m.access == Access::Public, public, "{}", m.path);
        }
    }
}
