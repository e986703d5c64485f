//! Password work with bounded cost (review H4).
//!
//! Checking a password is argon2id: about 19 MiB and tens of milliseconds of one core, by
//! design. Without a bound, a flood of wrong Basic logins (which need no account) takes a
//! node's memory and every blocking thread, and storage reads wait behind them. So:
//!
//! - argon2 runs on its own few threads ([`PasswordLimits::workers`], about the core count),
//!   never on the blocking pool that storage reads use;
//! - at most [`PasswordLimits::queue`] checks wait for a thread; beyond that a login is
//!   answered RESOURCE_EXHAUSTED at once (retriable; a client that holds the session token a
//!   successful call returns needs no password check at all);
//! - concurrent checks of the same credentials share one argon2 run (64 clients starting
//!   with the same Basic credentials cost one check, not 64);
//! - after [`FREE_FAILURES`] failures a user name, and separately a client address, must
//!   wait before its next check, doubling up to [`MAX_BACKOFF`]; a success clears it;
//! - an unknown user name costs the same check as a wrong password (against a dummy hash),
//!   so timing does not tell which names exist, and it backs off the same way;
//! - credentials already found wrong are answered at once without a check (a client
//!   retrying an old password in a loop costs nothing and does not back its address off;
//!   only new guesses do).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use cairn_core::Error;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::sync::oneshot;

/// Failures a user name or a client address may have before it backs off.
pub const FREE_FAILURES: u32 = 5;
/// Wait after the first failure beyond [`FREE_FAILURES`]; doubles with each further one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Longest wait between checks of one user name or one address.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Failures are forgotten this long after the last one.
const FAILURE_MEMORY: Duration = Duration::from_secs(15 * 60);
/// Names and addresses whose failures are remembered; beyond it the expired ones go first,
/// then all (a spray of names must not grow the map without bound).
const MAX_TRACKED: usize = 65_536;
/// Credentials remembered as wrong; the set starts over when full.
const MAX_KNOWN_WRONG: usize = 16_384;

/// How much password work a node does at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PasswordLimits {
    /// Threads running argon2.
    pub workers: usize,
    /// Checks waiting for a thread before RESOURCE_EXHAUSTED.
    pub queue: usize,
}

impl PasswordLimits {
    /// One thread per core, four waiting per thread.
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        PasswordLimits {
            workers: cores,
            queue: 4 * cores,
        }
    }
}

enum Job {
    Verify {
        hash: Option<String>,
        password: String,
        reply: oneshot::Sender<bool>,
    },
    Hash {
        password: String,
        reply: oneshot::Sender<Result<String, Error>>,
    },
}

/// What a check came to, for the caller and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    /// The password matched.
    Matched,
    /// It did not (or the user does not exist).
    Wrong,
}

type SharedCheck = Shared<BoxFuture<'static, Result<bool, Error>>>;

/// The argon2 threads and the bookkeeping around them. See the module docs.
pub struct PasswordChecks {
    jobs: SyncSender<Job>,
    limits: PasswordLimits,
    /// Checks running or queued, by the fingerprint of their credentials.
    running: Mutex<HashMap<[u8; 32], SharedCheck>>,
    /// Fingerprints of credentials a check found wrong.
    known_wrong: Mutex<std::collections::HashSet<[u8; 32]>>,
    backoff: Mutex<Backoff>,
}

impl std::fmt::Debug for PasswordChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordChecks")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A hash of a password nobody knows, verified for unknown user names: the same argon2
/// parameters as every stored hash, so the same cost.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let salt = SaltString::generate(&mut OsRng);
        let secret = uuid::Uuid::new_v4().to_string();
        Argon2::default()
            .hash_password(secret.as_bytes(), &salt)
            .map(|h| h.to_string())
            // Hashing fresh bytes with the default parameters does not fail; if it did,
            // an empty hash fails to parse and costs less, which only weakens the timing
            // cover.
            .unwrap_or_default()
    })
}

/// Whether `password` matches the argon2 PHC string `hash` (a blocking, deliberately slow
/// check: call it off the async threads).
pub(crate) fn verify(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// Hashes a password (argon2id, random salt).
fn hash(password: &str) -> Result<String, Error> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Error::internal(format!("failed to hash password: {e}")))
}

fn worker(jobs: Arc<Mutex<Receiver<Job>>>) {
    loop {
        // Held only while waiting: the next job goes to whichever thread is free.
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match job {
            Ok(Job::Verify {
                hash,
                password,
                reply,
            }) => {
                let ok = match &hash {
                    Some(hash) => verify(hash, &password),
                    None => {
                        verify(dummy_hash(), &password);
                        false
                    }
                };
                let _ = reply.send(ok);
            }
            Ok(Job::Hash { password, reply }) => {
                let _ = reply.send(hash(&password));
            }
            // Every sender is gone: the node stopped.
            Err(_) => return,
        }
    }
}

fn busy(limits: PasswordLimits) -> Error {
    Error::ResourceExhausted(format!(
        "too many password checks in progress ({} running, {} waiting); retry shortly, or send the session token (x-auth-token) a successful call returns instead of a password",
        limits.workers, limits.queue
    ))
}

fn stopped() -> Error {
    Error::Unavailable("the node is shutting down: password checks have stopped".into())
}

impl PasswordChecks {
    /// Starts the argon2 threads.
    pub fn start(limits: PasswordLimits) -> std::io::Result<Arc<Self>> {
        let (jobs, receiver) = sync_channel(limits.queue);
        let receiver = Arc::new(Mutex::new(receiver));
        for i in 0..limits.workers {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("cairn-argon2-{i}"))
                .spawn(move || worker(receiver))?;
        }
        Ok(Arc::new(PasswordChecks {
            jobs,
            limits,
            running: Mutex::new(HashMap::new()),
            known_wrong: Mutex::new(std::collections::HashSet::new()),
            backoff: Mutex::new(Backoff::default()),
        }))
    }

    /// The limits in force.
    pub fn limits(&self) -> PasswordLimits {
        self.limits
    }

    fn submit(&self, job: Job) -> Result<(), Error> {
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => busy(self.limits),
            TrySendError::Disconnected(_) => stopped(),
        })
    }

    /// Hashes a new password on the argon2 threads.
    pub async fn hash(&self, password: String) -> Result<String, Error> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Hash { password, reply })?;
        answer.await.map_err(|_| stopped())?
    }

    /// True when these credentials were checked and found wrong before.
    pub fn known_wrong(&self, fingerprint: &[u8; 32]) -> bool {
        self.known_wrong
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(fingerprint)
    }

    /// Checks `password` against `hash` (`None`: an unknown user, checked against a dummy
    /// so that it costs the same). `fingerprint` is a digest of the stored hash (or the
    /// unknown name) and the password: concurrent checks with the same one share one run,
    /// and a wrong one is remembered (see [`PasswordChecks::known_wrong`]).
    pub async fn verify(
        &self,
        fingerprint: [u8; 32],
        hash: Option<String>,
        password: &str,
    ) -> Result<CheckResult, Error> {
        if self.known_wrong(&fingerprint) {
            return Ok(CheckResult::Wrong);
        }
        let check = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            match running.get(&fingerprint) {
                Some(check) => check.clone(),
                None => {
                    let (reply, answer) = oneshot::channel();
                    self.submit(Job::Verify {
                        hash,
                        password: password.to_string(),
                        reply,
                    })?;
                    let check = async move { answer.await.map_err(|_| stopped()) }
                        .boxed()
                        .shared();
                    running.insert(fingerprint, check.clone());
                    check
                }
            }
        };
        // Removed however this call ends (a client that goes away mid-check included), so
        // the map holds only checks someone waits for.
        let _forget = Forget {
            running: &self.running,
            fingerprint,
        };
        if check.await? {
            return Ok(CheckResult::Matched);
        }
        let mut known = self.known_wrong.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_KNOWN_WRONG {
            known.clear();
        }
        known.insert(fingerprint);
        Ok(CheckResult::Wrong)
    }

    /// RESOURCE_EXHAUSTED while `user` or `addr` must wait after failed checks.
    pub fn admit(&self, user: &str, addr: Option<IpAddr>) -> Result<(), Error> {
        let now = Instant::now();
        let backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        let wait = [
            Some(Subject::User(user.to_string())),
            addr.map(Subject::Addr),
        ]
        .into_iter()
        .flatten()
        .filter_map(|s| backoff.wait(&s, now).map(|w| (s, w)))
        .max_by_key(|(_, w)| *w);
        match wait {
            None => Ok(()),
            Some((subject, wait)) => Err(Error::ResourceExhausted(format!(
                "too many failed logins for {subject}: retry in {} ms",
                wait.as_millis().max(1)
            ))),
        }
    }

    /// Records a check's result for `user` and `addr`.
    pub fn record(&self, user: &str, addr: Option<IpAddr>, result: CheckResult) {
        let now = Instant::now();
        let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        for subject in [
            Some(Subject::User(user.to_string())),
            addr.map(Subject::Addr),
        ]
        .into_iter()
        .flatten()
        {
            match result {
                CheckResult::Matched => backoff.clear(&subject),
                CheckResult::Wrong => backoff.failed(subject, now),
            }
        }
    }
}

/// Drops a shared check from the map of running ones.
struct Forget<'a> {
    running: &'a Mutex<HashMap<[u8; 32], SharedCheck>>,
    fingerprint: [u8; 32],
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.fingerprint);
    }
}

/// Who a failure is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    User(String),
    Addr(IpAddr),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::User(name) => write!(f, "user {name:?}"),
            Subject::Addr(addr) => write!(f, "client address {addr}"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    until: Instant,
}

/// Failed checks per user name and per client address.
#[derive(Default)]
struct Backoff {
    failures: HashMap<Subject, Failures>,
}

/// The wait after `count` failures.
fn backoff_after(count: u32) -> Duration {
    match count.checked_sub(FREE_FAILURES) {
        None | Some(0) => Duration::ZERO,
        Some(beyond) => {
            let doublings = (beyond - 1).min(16);
            FIRST_BACKOFF
                .saturating_mul(1u32 << doublings)
                .min(MAX_BACKOFF)
        }
    }
}

impl Backoff {
    fn wait(&self, subject: &Subject, now: Instant) -> Option<Duration> {
        let failures = self.failures.get(subject)?;
        (failures.until > now).then(|| failures.until - now)
    }

    fn failed(&mut self, subject: Subject, now: Instant) {
        if self.failures.len() >= MAX_TRACKED && !self.failures.contains_key(&subject) {
            self.failures
                .retain(|_, f| now.duration_since(f.last) < FAILURE_MEMORY || f.until > now);
            if self.failures.len() >= MAX_TRACKED {
                self.failures.clear();
            }
        }
        let entry = self.failures.entry(subject).or_insert(Failures {
            count: 0,
            last: now,
            until: now,
        });
        if now.duration_since(entry.last) >= FAILURE_MEMORY {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        entry.until = now + backoff_after(entry.count);
    }

    fn clear(&mut self, subject: &Subject) {
        self.failures.remove(subject);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[tokio::test]
    async fn hashes_verify_and_unknown_users_never_match() {
        let checks = PasswordChecks::start(PasswordLimits {
            workers: 1,
            queue: 4,
        })
        .expect("threads");
        let stored = checks.hash("s3cret".into()).await.expect("hash");
        assert!(stored.starts_with("$argon2id$") && !stored.contains("s3cret"));
        let check = |n, hash: Option<&str>, password| {
            checks.verify(fingerprint(n), hash.map(str::to_string), password)
        };
        assert_eq!(
            check(1, Some(&stored), "s3cret").await.expect("ran"),
            CheckResult::Matched
        );
        assert_eq!(
            check(2, Some(&stored), "wrong").await.expect("ran"),
            CheckResult::Wrong
        );
        assert_eq!(
            check(3, None, "s3cret").await.expect("ran"),
            CheckResult::Wrong
        );
        assert_eq!(
            check(4, Some("not a hash"), "s3cret").await.expect("ran"),
            CheckResult::Wrong
        );
    }

    #[tokio::test]
    async fn beyond_the_queue_checks_are_refused_at_once_and_identical_ones_share_a_run() {
        let limits = PasswordLimits {
            workers: 1,
            queue: 2,
        };
        let checks = PasswordChecks::start(limits).expect("threads");
        let stored = checks.hash("pw".into()).await.expect("hash");
        // One running and two waiting fill the node; the fourth distinct check is refused.
        let distinct: Vec<_> = (0..8u8)
            .map(|n| checks.verify(fingerprint(n), Some(stored.clone()), "wrong"))
            .collect();
        let results = futures::future::join_all(distinct).await;
        let refused = results
            .iter()
            .filter(|r| matches!(r, Err(Error::ResourceExhausted(_))))
            .count();
        let ran = results.iter().filter(|r| r.is_ok()).count();
        assert!(ran >= 2 && refused >= 1, "ran {ran}, refused {refused}");
        assert_eq!(ran + refused, 8);
        // The same credentials a hundred times over: one queued check, shared.
        let same: Vec<_> = (0..100)
            .map(|_| checks.verify(fingerprint(42), Some(stored.clone()), "pw"))
            .collect();
        for result in futures::future::join_all(same).await {
            assert_eq!(result.expect("shared run"), CheckResult::Matched);
        }
    }

    #[test]
    fn failures_back_off_per_user_and_address_until_a_success() {
        let checks = PasswordChecks::start(PasswordLimits {
            workers: 1,
            queue: 1,
        })
        .expect("threads");
        let addr: IpAddr = "10.1.2.3".parse().expect("ip");
        for _ in 0..FREE_FAILURES {
            checks.admit("ann", Some(addr)).expect("free failures");
            checks.record("ann", Some(addr), CheckResult::Wrong);
        }
        checks.admit("ann", Some(addr)).expect("still free");
        checks.record("ann", Some(addr), CheckResult::Wrong);
        let refused = checks.admit("ann", None).expect_err("user backs off");
        assert!(matches!(&refused, Error::ResourceExhausted(m) if m.contains("user \"ann\"")));
        let refused = checks
            .admit("bob", Some(addr))
            .expect_err("address backs off");
        assert!(matches!(&refused, Error::ResourceExhausted(m) if m.contains("10.1.2.3")));
        checks
            .admit("bob", None)
            .expect("another user elsewhere is not affected");
        checks.record("ann", Some(addr), CheckResult::Matched);
        checks
            .admit("ann", Some(addr))
            .expect("a success clears both");
    }

    #[tokio::test]
    async fn credentials_found_wrong_are_answered_without_another_check() {
        let checks = PasswordChecks::start(PasswordLimits {
            workers: 1,
            queue: 1,
        })
        .expect("threads");
        let stored = checks.hash("pw".into()).await.expect("hash");
        assert!(!checks.known_wrong(&fingerprint(7)));
        let first = checks.verify(fingerprint(7), Some(stored.clone()), "nope");
        assert_eq!(first.await.expect("ran"), CheckResult::Wrong);
        assert!(checks.known_wrong(&fingerprint(7)));
        for _ in 0..100 {
            let again = checks.verify(fingerprint(7), Some(stored.clone()), "nope");
            assert_eq!(again.await.expect("answered"), CheckResult::Wrong);
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff_after(FREE_FAILURES), Duration::ZERO);
        assert_eq!(backoff_after(FREE_FAILURES + 1), FIRST_BACKOFF);
        assert_eq!(backoff_after(FREE_FAILURES + 2), FIRST_BACKOFF * 2);
        assert_eq!(backoff_after(FREE_FAILURES + 3), FIRST_BACKOFF * 4);
        assert_eq!(backoff_after(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn a_spray_of_names_does_not_grow_the_map_without_bound() {
        let mut backoff = Backoff::default();
        let now = Instant::now();
        for i in 0..(MAX_TRACKED + 10) {
            backoff.failed(Subject::User(i.to_string()), now);
        }
        assert!(backoff.failures.len() <= MAX_TRACKED);
    }
}
