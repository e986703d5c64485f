//! Authentication and authorisation (A1–A4).
//!
//! Credentials are either HTTP Basic or a session token (`x-auth-token`). Tokens are
//! stateless: `base64url(user_id:generation:expiry:login).base64url(HMAC-SHA256)` under a
//! random key kept in the replicated catalog, so any node can verify a token any other node
//! issued. A token is valid while unexpired, while its user exists and while the user's
//! credential generation (bumped by every password change) matches: deleting a user or
//! changing a password revokes its tokens at once. `login` is when the password was last
//! checked for this session: every token a response hands out carries it on, and none
//! expires later than `login + max_age`, so a session (and a stolen token) ends then
//! however busy it is.
//!
//! An administrator may rotate the key (`cairn.v1.Tokens/RotateKey`): new tokens are signed
//! with the new key at once, and tokens of the key it replaced stay valid until the
//! rotation's grace period ends (by the leader's clock), then stop, cached or not. Clients
//! pick up new-key tokens from any response in the meantime. A key replaced by an earlier
//! rotation is forgotten.
//!
//! Passwords are stored as argon2id PHC strings. Verifying one costs tens of milliseconds
//! by design, so a successful Basic login is remembered under the SHA-256 of
//! `username:password` (never the password itself) together with the credential generation
//! it was verified against; a password change invalidates the entry. Every other check runs
//! on [`PasswordChecks`]' own threads, bounded, shared by identical concurrent logins and
//! backed off after failures (see [`crate::password`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use cairn_core::Error;
use cairn_core::auth::{Role, UserRecord};
use cairn_core::command::TokenKeyState;
use cairn_store::Store;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::methods::Access;
use crate::password::{CheckResult, PasswordChecks};

/// Response/request header carrying a session token.
pub const TOKEN_HEADER: &str = "x-auth-token";
/// Basic credentials verified recently, remembered to spare argon2 on every request.
const BASIC_CACHE_CAPACITY: usize = 4096;
/// Session tokens verified recently, remembered to spare an HMAC and two base64 passes on
/// every request of a busy client.
const VERIFIED_TOKEN_CACHE_CAPACITY: usize = 4096;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// User id.
    pub user_id: String,
    /// Login name.
    pub username: String,
    /// Roles.
    pub roles: Vec<Role>,
    /// When this session's password was checked (Unix seconds): the tokens issued to it
    /// expire at the latest `max_age` after.
    pub logged_in_at: u64,
}

impl Principal {
    fn of(user: &UserRecord, logged_in_at: u64) -> Self {
        Principal {
            user_id: user.user_id.clone(),
            username: user.username.clone(),
            roles: user.roles.clone(),
            logged_in_at,
        }
    }

    /// Checks that the caller holds one of `roles` (A3).
    pub fn require(&self, roles: &[Role], what: &str) -> Result<(), Error> {
        if self.roles.iter().any(|r| roles.contains(r)) {
            Ok(())
        } else {
            let names: Vec<&str> = roles.iter().map(Role::as_str).collect();
            Err(Error::PermissionDenied(format!(
                "{what} requires role {}; user \"{}\" has {}",
                names.join(" or "),
                self.username,
                if self.roles.is_empty() {
                    "none".to_string()
                } else {
                    self.roles
                        .iter()
                        .map(Role::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )))
        }
    }
}

/// Roles a gRPC method needs (A3); `None` = any authenticated user (unknown paths too:
/// they are authenticated, then answered UNIMPLEMENTED).
pub fn required_roles(path: &str) -> Option<&'static [Role]> {
    match crate::methods::lookup(path)?.access {
        Access::Roles(roles) => Some(roles),
        Access::Public | Access::AnyUser => None,
    }
}

/// True for methods served without credentials (A1: health; reflection, whose schema is
/// the public protocol).
pub fn is_public(path: &str) -> bool {
    crate::methods::lookup(path).is_some_and(|m| m.access == Access::Public)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// How long session tokens live.
#[derive(Debug, Clone, Copy)]
pub struct TokenLifetime {
    /// From the last response that handed one out (a sliding window).
    pub ttl: Duration,
    /// From the password login that began the session, at most.
    pub max_age: Duration,
}

/// Verifies credentials and issues tokens.
pub struct Authenticator {
    store: Store,
    lifetime: TokenLifetime,
    passwords: Arc<PasswordChecks>,
    basic_cache: Mutex<HashMap<[u8; 32], (String, u64)>>,
    tokens: Mutex<TokenCache>,
}

/// A token's claims: user id, credential generation, expiry and login (Unix seconds).
#[derive(Debug)]
struct Claims {
    user_id: String,
    generation: u64,
    expiry: u64,
    logged_in_at: u64,
}

/// Tokens recently issued and verified. Expiry has one-second resolution, so a token issued
/// in the same second for the same user, credential generation and key is exactly the token
/// that would be signed again: reusing it keeps the sliding expiry unchanged while a busy
/// client costs a map lookup instead of an HMAC per response.
#[derive(Default)]
struct TokenCache {
    /// Per user id: the last issued token with what it was signed for.
    issued: HashMap<String, Issued>,
    /// Token text → its verified claims and the generation of the key that signed it (the
    /// signature checked once; the key's acceptance every time).
    verified: HashMap<String, (Claims, u64)>,
}

/// A token handed out, and what would make it different if signed again.
struct Issued {
    credential_generation: u64,
    expiry: u64,
    key_generation: u64,
    token: String,
}

/// The key that signs new tokens and the one it replaced (whether that one is still
/// accepted is [`Authenticator::key_accepted`]'s to say).
struct SigningKeys {
    current: Vec<u8>,
    generation: u64,
    previous: Option<Vec<u8>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

/// Why authentication failed (metric label and message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No credentials at all.
    Missing,
    /// Malformed header.
    Malformed,
    /// Wrong user or password.
    BadPassword,
    /// Token expired, forged, or revoked.
    BadToken,
    /// Not checked: too many password checks in progress, or too many failures of this
    /// user name or client address (RESOURCE_EXHAUSTED).
    Throttled,
}

impl AuthFailure {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Malformed => "malformed",
            AuthFailure::BadPassword => "bad_password",
            AuthFailure::BadToken => "bad_token",
            AuthFailure::Throttled => "throttled",
        }
    }

    /// True when the verdict rests on a user record this node may not have yet: an
    /// unknown name, a password or a token's credential generation from a change made
    /// through another node.
    pub fn may_be_stale(&self) -> bool {
        match self {
            AuthFailure::BadPassword | AuthFailure::BadToken => true,
            AuthFailure::Missing | AuthFailure::Malformed | AuthFailure::Throttled => false,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "credentials required: send \"authorization: Basic <base64(user:password)>\" or \"x-auth-token: <token>\""
            }
            AuthFailure::Malformed => "malformed authorization header: expected Basic credentials",
            AuthFailure::BadPassword => "invalid username or password",
            AuthFailure::BadToken => "invalid or expired session token",
            AuthFailure::Throttled => "too many password checks: retry later",
        }
    }
}

impl From<AuthFailure> for Error {
    fn from(f: AuthFailure) -> Self {
        Error::Unauthenticated(f.message().to_string())
    }
}

impl Authenticator {
    /// An authenticator reading users and the token key from `store`'s catalog.
    pub fn new(store: Store, lifetime: TokenLifetime, passwords: Arc<PasswordChecks>) -> Self {
        Authenticator {
            store,
            lifetime,
            passwords,
            basic_cache: Mutex::new(HashMap::new()),
            tokens: Mutex::new(TokenCache::default()),
        }
    }

    /// The keys a token may be signed with.
    fn signing_keys(&self) -> Result<SigningKeys, Error> {
        self.store
            .with_catalog(|c| {
                c.token_key.clone().map(|current| SigningKeys {
                    current,
                    generation: c.token_key_state.generation,
                    previous: c.previous_token_key.clone(),
                })
            })
            .ok_or_else(|| Error::Unavailable("node is still starting: no token key yet".into()))
    }

    /// Whether a token signed by the key of `generation` is still accepted at `now_nanos`:
    /// the current key always, the one it replaced until the grace period ends, older ones
    /// never.
    fn key_accepted(state: &TokenKeyState, generation: u64, now_nanos: i64) -> bool {
        generation == state.generation
            || (generation + 1 == state.generation
                && now_nanos < state.previous_accepted_until_unix_nanos)
    }

    fn mac(key: &[u8], payload: &[u8]) -> Result<Vec<u8>, Error> {
        let mut mac = Hmac::<Sha256>::new_from_slice(key)
            .map_err(|e| Error::internal(format!("bad token key: {e}")))?;
        mac.update(payload);
        Ok(mac.finalize().into_bytes().to_vec())
    }

    /// A fresh session token for `principal`, valid for the configured TTL but never past
    /// the session's maximum age.
    pub fn issue_token(&self, principal: &Principal) -> Result<String, Error> {
        let (generation, key_generation) = self
            .store
            .with_catalog(|c| {
                c.users
                    .get(&principal.user_id)
                    .map(|u| (u.credential_generation, c.token_key_state.generation))
            })
            .ok_or_else(|| Error::Unauthenticated("user no longer exists".into()))?;
        let expiry = (now_secs() + self.lifetime.ttl.as_secs())
            .min(principal.logged_in_at + self.lifetime.max_age.as_secs());
        if let Some(issued) = self.tokens().issued.get(&principal.user_id)
            && (
                issued.credential_generation,
                issued.expiry,
                issued.key_generation,
            ) == (generation, expiry, key_generation)
        {
            return Ok(issued.token.clone());
        }
        let payload = format!(
            "{}:{generation}:{expiry}:{}",
            principal.user_id, principal.logged_in_at
        );
        let keys = self.signing_keys()?;
        let mac = Self::mac(&keys.current, payload.as_bytes())?;
        let token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(mac)
        );
        self.tokens().issued.insert(
            principal.user_id.clone(),
            Issued {
                credential_generation: generation,
                expiry,
                key_generation: keys.generation,
                token: token.clone(),
            },
        );
        Ok(token)
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn verify_token(&self, token: &str) -> Result<Principal, Error> {
        let token = token.trim();
        if let Some((claims, key_generation)) = self.tokens().verified.get(token) {
            return self.admit(claims, *key_generation);
        }
        let (claims, key_generation) = self.verify_signature(token)?;
        let principal = self.admit(&claims, key_generation);
        let mut cache = self.tokens();
        if cache.verified.len() >= VERIFIED_TOKEN_CACHE_CAPACITY {
            cache.verified.clear();
        }
        cache
            .verified
            .insert(token.to_string(), (claims, key_generation));
        principal
    }

    /// The principal of `claims` signed by the key of `key_generation`, if they are
    /// unexpired, the key is still accepted, and the user still has the credential
    /// generation they name.
    fn admit(&self, claims: &Claims, key_generation: u64) -> Result<Principal, Error> {
        let bad = || Error::from(AuthFailure::BadToken);
        let now = now_secs();
        if claims.expiry <= now || claims.logged_in_at + self.lifetime.max_age.as_secs() <= now {
            return Err(bad());
        }
        let now_nanos = now_nanos();
        self.store.with_catalog(|c| {
            if !Self::key_accepted(&c.token_key_state, key_generation, now_nanos) {
                return Err(bad());
            }
            match c.users.get(&claims.user_id) {
                Some(user) if user.credential_generation == claims.generation => {
                    Ok(Principal::of(user, claims.logged_in_at))
                }
                _ => Err(bad()),
            }
        })
    }

    /// Checks a token's signature against the current and the previous key and parses its
    /// claims (not its expiry, generation or key's acceptance, which change meaning with
    /// time and with the catalog); with them, the generation of the key that signed it.
    fn verify_signature(&self, token: &str) -> Result<(Claims, u64), Error> {
        let bad = || Error::from(AuthFailure::BadToken);
        let (payload_b64, mac_b64) = token.split_once('.').ok_or_else(bad)?;
        let payload = URL_SAFE_NO_PAD.decode(payload_b64).map_err(|_| bad())?;
        let mac = URL_SAFE_NO_PAD.decode(mac_b64).map_err(|_| bad())?;
        let keys = self.signing_keys()?;
        let signed_by = |key: &[u8]| -> Result<bool, Error> {
            let mut verifier = Hmac::<Sha256>::new_from_slice(key)
                .map_err(|e| Error::internal(format!("bad token key: {e}")))?;
            verifier.update(&payload);
            Ok(verifier.verify_slice(&mac).is_ok())
        };
        let key_generation = if signed_by(&keys.current)? {
            keys.generation
        } else if let (Some(previous), Some(previous_generation)) =
            (&keys.previous, keys.generation.checked_sub(1))
            && signed_by(previous)?
        {
            previous_generation
        } else {
            return Err(bad());
        };
        let payload = String::from_utf8(payload).map_err(|_| bad())?;
        let mut parts = payload.split(':');
        let (Some(user_id), Some(generation), Some(expiry), login, None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let expiry: u64 = expiry.parse().map_err(|_| bad())?;
        let logged_in_at = match login {
            Some(login) => login.parse().map_err(|_| bad())?,
            // A token of a release before the maximum age: its session is taken to have
            // begun when this token was issued, so it ends within one maximum age too.
            None => expiry.saturating_sub(self.lifetime.ttl.as_secs()),
        };
        let claims = Claims {
            user_id: user_id.to_string(),
            generation: generation.parse().map_err(|_| bad())?,
            expiry,
            logged_in_at,
        };
        Ok((claims, key_generation))
    }

    async fn verify_basic(
        &self,
        header: &str,
        addr: Option<IpAddr>,
    ) -> Result<Principal, (Error, AuthFailure)> {
        let fail = |f: AuthFailure| (Error::from(f), f);
        let encoded = header
            .strip_prefix("Basic ")
            .or_else(|| header.strip_prefix("basic "))
            .ok_or_else(|| fail(AuthFailure::Malformed))?;
        let decoded = STANDARD
            .decode(encoded.trim())
            .map_err(|_| fail(AuthFailure::Malformed))?;
        let decoded = String::from_utf8(decoded).map_err(|_| fail(AuthFailure::Malformed))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| fail(AuthFailure::Malformed))?;
        let fingerprint: [u8; 32] = Sha256::digest(decoded.as_bytes()).into();

        let user = self
            .store
            .with_catalog(|c| c.user_by_name(username).cloned());
        if let Some(user) = &user {
            let cached = self
                .basic_cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&fingerprint)
                .cloned();
            if cached == Some((user.user_id.clone(), user.credential_generation)) {
                return Ok(Principal::of(user, now_secs()));
            }
        }
        // An unknown name takes the same path as a wrong password: same check, same cost,
        // same backoff.
        let throttled = |e: Error| match e {
            Error::ResourceExhausted(_) => (e, AuthFailure::Throttled),
            other => (other, AuthFailure::BadPassword),
        };
        let result = self
            .check(username, user.as_ref(), password, addr)
            .await
            .map_err(throttled)?;
        let Some(user) = user.filter(|_| result == CheckResult::Matched) else {
            return Err(fail(AuthFailure::BadPassword));
        };
        let mut cache = self.basic_cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= BASIC_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(
            fingerprint,
            (user.user_id.clone(), user.credential_generation),
        );
        Ok(Principal::of(&user, now_secs()))
    }

    /// Authenticates a request from its headers (A1): a valid token wins; otherwise Basic.
    pub async fn authenticate(
        &self,
        headers: &http::HeaderMap,
        addr: Option<IpAddr>,
    ) -> Result<Principal, (Error, AuthFailure)> {
        let token = headers
            .get(TOKEN_HEADER)
            .map(|v| v.to_str().unwrap_or_default());
        let basic = headers
            .get(http::header::AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or_default());
        let token_result = token.map(|t| self.verify_token(t));
        match (token_result, basic) {
            (Some(Ok(p)), _) => Ok(p),
            (_, Some(basic)) => self.verify_basic(basic, addr).await,
            (Some(Err(e)), None) => Err((e, AuthFailure::BadToken)),
            (None, None) => Err((AuthFailure::Missing.into(), AuthFailure::Missing)),
        }
    }

    /// Checks a user's current password (ChangePassword, ValidateCredentials), bounded and
    /// backed off like a login.
    pub async fn check_password(&self, user: &UserRecord, password: &str) -> Result<bool, Error> {
        let result = self
            .check(&user.username, Some(user), password, None)
            .await?;
        Ok(result == CheckResult::Matched)
    }

    /// One bounded password check of `username` (`user`: its record, if it exists) from
    /// `addr`, recorded for the backoff.
    async fn check(
        &self,
        username: &str,
        user: Option<&UserRecord>,
        password: &str,
        addr: Option<IpAddr>,
    ) -> Result<CheckResult, Error> {
        // Identical checks share one run and one verdict: the same stored hash (it changes
        // with every password change) or the same unknown name, and the same password.
        let mut digest = Sha256::new();
        match user {
            Some(user) => digest.update(user.password_hash.as_bytes()),
            None => {
                digest.update(b"\0unknown user\0");
                digest.update(username.as_bytes());
            }
        }
        digest.update(b"\0");
        digest.update(password.as_bytes());
        let fingerprint: [u8; 32] = digest.finalize().into();
        // A repeat of a wrong guess costs nothing and is not a new guess.
        if self.passwords.known_wrong(&fingerprint) {
            return Ok(CheckResult::Wrong);
        }
        self.passwords.admit(username, addr)?;
        let result = self
            .passwords
            .verify(fingerprint, user.map(|u| u.password_hash.clone()), password)
            .await?;
        self.passwords.record(username, addr, result);
        Ok(result)
    }

    /// Hashes a new password on the password threads (bounded like checks).
    pub async fn hash_password(&self, password: String) -> Result<String, Error> {
        self.passwords.hash(password).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_roles() {
        assert_eq!(
            required_roles("/orisun.EventStore/SaveEventsV2"),
            Some(&[Role::Admin, Role::Operations][..])
        );
        assert_eq!(
            required_roles("/orisun.EventStore/CreateIndex"),
            Some(&[Role::Admin][..])
        );
        assert_eq!(required_roles("/orisun.EventStore/GetEvents"), None);
        assert_eq!(required_roles("/orisun.Admin/ChangePassword"), None);
        assert!(is_public("/grpc.health.v1.Health/Check"));
        assert!(is_public(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!is_public("/orisun.EventStore/Ping"));
        assert!(!is_public("/grpc.health.v1.Health/Unknown"));
    }

    fn store_with_user() -> (tempfile::TempDir, Store, Principal) {
        use cairn_core::command::Command;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), &Default::default()).expect("open");
        let user = UserRecord {
            user_id: "u1".into(),
            name: "Ann".into(),
            username: "ann".into(),
            password_hash: String::new(),
            roles: vec![Role::Operations],
            created_unix_nanos: 0,
            updated_unix_nanos: 0,
            credential_generation: 0,
        };
        for command in [
            Command::InitTokenKey { key: vec![7; 32] },
            Command::CreateUser {
                user: user.clone(),
                if_absent: false,
            },
        ] {
            store
                .apply(&command, b"m")
                .expect("apply")
                .expect("applied");
        }
        (dir, store, Principal::of(&user, now_secs()))
    }

    #[test]
    fn cached_tokens_still_die_with_their_credentials() {
        let (_dir, store, ann) = store_with_user();
        let auth = Authenticator::new(store.clone(), lifetime(3600, 86_400), test_checks());
        let token = auth.issue_token(&ann).expect("issue");
        assert_eq!(auth.verify_token(&token).expect("valid"), ann);
        // Verified again from the cache.
        assert_eq!(auth.verify_token(&token).expect("still valid"), ann);
        // A forged signature is never cached as valid, however often it is tried.
        let (payload, _) = token.split_once('.').expect("two parts");
        let forged = format!("{payload}.{}", URL_SAFE_NO_PAD.encode([0u8; 32]));
        for _ in 0..2 {
            assert!(auth.verify_token(&forged).is_err());
        }
        store
            .apply(
                &cairn_core::command::Command::SetPassword {
                    user_id: "u1".into(),
                    password_hash: String::new(),
                    at_unix_nanos: 1,
                },
                b"m",
            )
            .expect("apply")
            .expect("applied");
        assert!(
            auth.verify_token(&token).is_err(),
            "a password change revokes a token verified before it"
        );
        let fresh = auth.issue_token(&ann).expect("issue");
        assert_ne!(fresh, token, "tokens carry the new credential generation");
        assert_eq!(auth.verify_token(&fresh).expect("valid"), ann);
    }

    #[test]
    fn every_issued_token_expires_a_full_ttl_after_it_is_handed_out() {
        let (_dir, store, ann) = store_with_user();
        let auth = Authenticator::new(store, lifetime(3600, 86_400), test_checks());
        for _ in 0..3 {
            let before = now_secs();
            let token = auth.issue_token(&ann).expect("issue");
            let (claims, _) = auth.verify_signature(&token).expect("signed");
            assert!(
                claims.expiry >= before + 3600,
                "the session slides with each response"
            );
        }
    }

    fn lifetime(ttl: u64, max_age: u64) -> TokenLifetime {
        TokenLifetime {
            ttl: Duration::from_secs(ttl),
            max_age: Duration::from_secs(max_age),
        }
    }

    #[test]
    fn a_session_ends_at_its_maximum_age_however_often_it_is_refreshed() {
        let (_dir, store, mut ann) = store_with_user();
        let auth = Authenticator::new(store, lifetime(3600, 600), test_checks());
        // Logged in 100 s ago: tokens handed out now carry that login on and expire 500 s
        // from now, not an hour.
        ann.logged_in_at = now_secs() - 100;
        let token = auth.issue_token(&ann).expect("issue");
        let (claims, _) = auth.verify_signature(&token).expect("signed");
        assert_eq!(claims.logged_in_at, ann.logged_in_at);
        assert_eq!(claims.expiry, ann.logged_in_at + 600);
        let refreshed_for = auth.verify_token(&token).expect("valid");
        assert_eq!(refreshed_for.logged_in_at, ann.logged_in_at, "carried on");
        // A session older than the maximum age gets no usable token.
        ann.logged_in_at = now_secs() - 601;
        let stale = auth.issue_token(&ann).expect("issue");
        assert!(auth.verify_token(&stale).is_err(), "past its maximum age");
    }

    #[test]
    fn tokens_of_the_previous_format_live_one_maximum_age_at_most() {
        let (_dir, store, ann) = store_with_user();
        let auth = Authenticator::new(store, lifetime(3600, 600), test_checks());
        let key = auth.signing_keys().expect("key").current;
        let old = |expiry: u64| {
            let payload = format!("{}:0:{expiry}", ann.user_id);
            let mac = Authenticator::mac(&key, payload.as_bytes()).expect("mac");
            format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(payload),
                URL_SAFE_NO_PAD.encode(mac)
            )
        };
        // Issued just now (expiry one TTL ahead): valid, its session begun now.
        let fresh = auth.verify_token(&old(now_secs() + 3600)).expect("valid");
        assert!(fresh.logged_in_at + 5 >= now_secs());
        // Issued 20 minutes ago with a 60-minute TTL: unexpired, but past the maximum age.
        assert!(auth.verify_token(&old(now_secs() + 2400)).is_err());
    }

    fn rotate(store: &Store, key: u8, at_unix_nanos: i64, grace: Duration) {
        store
            .apply(
                &cairn_core::command::Command::RotateTokenKey {
                    key: vec![key; 32],
                    grace_nanos: i64::try_from(grace.as_nanos()).expect("grace"),
                    at_unix_nanos,
                },
                b"m",
            )
            .expect("apply")
            .expect("rotated");
    }

    #[test]
    fn tokens_of_the_replaced_key_live_through_the_grace_period_and_new_ones_use_the_new_key() {
        let (_dir, store, ann) = store_with_user();
        let auth = Authenticator::new(store.clone(), lifetime(3600, 86_400), test_checks());
        let old = auth.issue_token(&ann).expect("issue");
        assert_eq!(auth.verify_token(&old).expect("valid"), ann, "cached now");
        rotate(&store, 8, now_nanos(), Duration::from_secs(3600));
        assert_eq!(auth.verify_token(&old).expect("in the grace period"), ann);
        // Another node, which never saw the token, takes it too.
        let elsewhere = Authenticator::new(store.clone(), lifetime(3600, 86_400), test_checks());
        assert_eq!(elsewhere.verify_token(&old).expect("previous key"), ann);
        let new = auth.issue_token(&ann).expect("issue");
        assert_ne!(new, old, "signed with the new key, not the cached token");
        assert_eq!(elsewhere.verify_token(&new).expect("current key"), ann);
        // A second rotation forgets the first key at once, however long its grace.
        rotate(&store, 9, now_nanos(), Duration::from_secs(3600));
        for verifier in [&auth, &elsewhere] {
            assert!(verifier.verify_token(&old).is_err(), "two keys ago");
            assert_eq!(verifier.verify_token(&new).expect("previous key"), ann);
        }
    }

    #[test]
    fn tokens_of_the_replaced_key_stop_when_the_grace_period_ends_even_if_cached() {
        let (_dir, store, ann) = store_with_user();
        let auth = Authenticator::new(store.clone(), lifetime(3600, 86_400), test_checks());
        let old = auth.issue_token(&ann).expect("issue");
        assert_eq!(auth.verify_token(&old).expect("valid"), ann, "cached now");
        // Rotated ten seconds ago with five seconds of grace: over.
        let ten_seconds_ago = now_nanos() - 10_000_000_000;
        rotate(&store, 8, ten_seconds_ago, Duration::from_secs(5));
        assert!(
            auth.verify_token(&old).is_err(),
            "cached, but its key is retired"
        );
        let fresh = Authenticator::new(store.clone(), lifetime(3600, 86_400), test_checks());
        assert!(fresh.verify_token(&old).is_err(), "verified anew");
        let new = auth.issue_token(&ann).expect("issue");
        assert_eq!(fresh.verify_token(&new).expect("current key"), ann);
        // No grace at all: a leaked key's tokens end with the rotation.
        rotate(&store, 9, now_nanos(), Duration::ZERO);
        assert!(auth.verify_token(&new).is_err());
        assert!(fresh.verify_token(&new).is_err());
    }

    fn test_checks() -> Arc<PasswordChecks> {
        PasswordChecks::start(crate::password::PasswordLimits {
            workers: 1,
            queue: 8,
        })
        .expect("threads")
    }
}
