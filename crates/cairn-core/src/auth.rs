//! Users and roles (A2–A4). Password hashing lives in the server; the domain only holds
//! the hash.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Length of a session-token key: HMAC-SHA256 is as strong as its hash with a key of the
/// hash's output length, and weaker with a shorter one.
pub const TOKEN_KEY_BYTES: usize = 32;

/// The two roles of the contract (A2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Everything.
    Admin,
    /// Writes and index reads, no administration.
    Operations,
}

impl Role {
    /// The wire spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Admin => "ADMIN",
            Role::Operations => "OPERATIONS",
        }
    }

    /// Parses the wire spelling exactly (A2).
    pub fn parse(s: &str) -> Result<Role, Error> {
        match s {
            "ADMIN" => Ok(Role::Admin),
            "OPERATIONS" => Ok(Role::Operations),
            other => Err(Error::invalid(format!(
                "role {other:?} is invalid: roles are ADMIN and OPERATIONS"
            ))),
        }
    }
}

/// A stored user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Server-assigned id.
    pub user_id: String,
    /// Display name.
    pub name: String,
    /// Login name, unique.
    pub username: String,
    /// PHC-format password hash (argon2id).
    pub password_hash: String,
    /// Roles, sorted and unique.
    pub roles: Vec<Role>,
    /// Creation time, ns since the epoch.
    pub created_unix_nanos: i64,
    /// Last change, ns since the epoch.
    pub updated_unix_nanos: i64,
    /// Bumped on every password change: session tokens carry it, so older tokens die (A3).
    pub credential_generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_exact() {
        assert_eq!(Role::parse("ADMIN"), Ok(Role::Admin));
        assert_eq!(Role::parse("OPERATIONS"), Ok(Role::Operations));
        assert!(Role::parse("admin").is_err());
        assert!(Role::parse("READER").is_err());
    }
}
