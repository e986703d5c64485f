//! The Cairn node: gRPC services (Orisun EventStore and Admin, health, reflection), auth,
//! subscriptions, metrics and probes, configuration, and the `cairn` binary's entry point.

pub mod admin;
pub mod admission;
pub mod archive;
pub mod auth;
pub mod backup;
pub mod backup_cli;
pub mod backup_target;
pub mod bootstrap;
pub mod boundaries;
pub mod cli;
pub mod client_cli;
pub mod cluster;
pub mod cluster_cli;
pub mod config;
pub mod data_dir;
pub mod event_store;
pub mod formation;
pub mod grpc_layer;
pub mod http;
pub mod listeners;
pub mod methods;
pub mod metrics;
pub mod password;
pub mod peer;
pub mod router;
pub mod rpc;
pub mod server;
pub mod state;
pub mod subscription;
pub mod tls;
pub mod tokens;
pub mod tokens_cli;

pub use cli::Cli;
pub use config::{ServeArgs, ServeConfig};
pub use server::{RunningServer, ServerError, start, start_on};
