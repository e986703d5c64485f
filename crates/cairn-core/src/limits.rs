//! Every server-side limit, in one place, so docs and enforcement cannot drift apart.

/// Maximum consistency observations in one write (C1).
pub const MAX_OBSERVATIONS: usize = 1024;
/// Maximum criteria in one write's observations, or in one read query (C1).
pub const MAX_CRITERIA: usize = 4096;
/// Maximum tags across all criteria of one write's observations, or of one read query (C1).
pub const MAX_TAGS: usize = 16384;
/// Maximum events in one write. Bounds the size of a single Raft entry and apply batch.
pub const MAX_EVENTS_PER_WRITE: usize = 10_000;
/// Maximum page size of GetEvents (G1).
pub const MAX_READ_COUNT: u32 = 10_000;
/// Maximum length in bytes of an event id.
pub const MAX_EVENT_ID_BYTES: usize = 1024;
/// Maximum length in bytes of an event type.
pub const MAX_EVENT_TYPE_BYTES: usize = 1024;
/// Maximum nesting depth of event data/metadata JSON, the top-level object counted: what
/// serde_json's recursion limit (128) lets through; one level more is INVALID_ARGUMENT.
pub const MAX_JSON_DEPTH: usize = 127;
/// Maximum length of a boundary or index name (B1).
pub const MAX_NAME_LEN: usize = 63;
/// Numbers whose plain decimal expansion would exceed this many characters are indexed by
/// their literal text instead (keeps `1e999999` from allocating a megabyte per tag).
pub const MAX_NUMBER_EXPANSION: usize = 1024;
/// Maximum length of a username or a display name.
pub const MAX_USERNAME_BYTES: usize = 256;
/// Maximum length of a password (argon2 input).
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// Tags of one event, `eventType` included: each is a posting-list row written with it.
pub const MAX_TAGS_PER_EVENT: usize = 1024;
/// Maximum length in bytes of a subscriber name (the name of a replicated lease).
pub const MAX_SUBSCRIBER_NAME_BYTES: usize = 256;
/// Default largest event (id, type, data and metadata as sent): KurrentDB's default
/// largest append. Every event of a read page is held in memory while the page is built,
/// and every event travels in one Raft entry to every replica.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1024 * 1024;
/// Default byte budget of one read response (a GetEvents page, a subscription page): a page
/// ends at the event that reaches it (never fewer than one event), and the client pages on
/// from the last event it received. A response is at most the budget plus one event plus
/// each event's framing: at 2 MiB with 1 MiB events it stays inside the 4 MiB that stock
/// gRPC clients accept by default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 2 * 1024 * 1024;
