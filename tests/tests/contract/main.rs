//! Black-box tests of every rule of the wire contract (listed in `docs/rules.md`) against a
//! real server on 127.0.0.1:0, through tonic clients generated from `proto/orisun`. Each
//! module is named after the rule group it covers; each test names the rule (A1, C2, …) it
//! proves.

mod archive;
mod auth;
mod backup;
mod bad_input;
mod boundaries;
mod ccc;
mod concurrency;
mod events;
mod idempotent;
mod indexes;
mod info;
mod limits;
mod matching;
mod observability;
mod positions;
mod reads;
mod retention;
mod subscriptions;
mod tls;
