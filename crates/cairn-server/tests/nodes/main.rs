//! Black-box suites that run real `cairn` processes: first contact as a stock client makes
//! it, durability under SIGKILL, the multi-node cluster, and the Jepsen-style bank test.
//!
//! They are one test binary rather than four: one link of RocksDB instead of four, the
//! support harness compiled once, and the bank run overlaps the cluster tests instead of
//! waiting for them (filter with `-- bank::`, `-- cluster::`, ...).

mod abuse;
mod backup;
mod backup_s3;
mod bank;
mod cluster;
mod credentials;
mod disk;
mod durability;
mod exactly_once;
mod first_contact;
mod peer_tls;
mod support;
mod wiped;
