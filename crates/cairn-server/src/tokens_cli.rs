//! `cairn tokens …`: the session-token key, through any node's client port (ADMIN).

use cairn_proto::cairn_v1 as pb;
use cairn_proto::cairn_v1::tokens_client::TokensClient;
use serde_json::json;

use crate::client_cli::ClientPortArgs;

/// Flags of `cairn tokens`.
#[derive(Debug, clap::Args)]
pub struct TokensArgs {
    #[command(flatten)]
    client: ClientPortArgs,

    /// What to do.
    #[command(subcommand)]
    action: TokensAction,
}

/// `cairn tokens` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TokensAction {
    /// Replace the cluster's session-token key: new tokens are signed with a fresh key at
    /// once; tokens of the replaced key keep working for --grace-secs, then stop on every
    /// node. Clients holding a token pick up a new one from any response meanwhile.
    RotateKey {
        /// How long tokens of the replaced key stay valid (default a day, the default token
        /// lifetime; 0 if the key leaked: every token stops now; at most a week).
        #[arg(long, env = "CAIRN_TOKEN_KEY_GRACE_SECS")]
        grace_secs: Option<u64>,
    },
    /// The key's generation (number of rotations), when it was rotated, and until when
    /// tokens of the previous key are accepted.
    Status,
}

fn unix(seconds: i64) -> String {
    if seconds == 0 {
        return "never".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let delta = seconds - now;
    if delta >= 0 {
        format!("unix {seconds} (in {delta} s)")
    } else {
        format!("unix {seconds} ({} s ago)", -delta)
    }
}

fn print(status: &pb::TokenKeyStatus, headline: &str, as_json: bool) {
    if as_json {
        println!(
            "{}",
            json!({
                "generation": status.generation,
                "rotated_at_unix_seconds": status.rotated_at_unix_seconds,
                "previous_accepted_until_unix_seconds": status.previous_accepted_until_unix_seconds,
            })
        );
        return;
    }
    println!("{headline}");
    println!("generation:               {}", status.generation);
    println!(
        "rotated:                  {}",
        unix(status.rotated_at_unix_seconds)
    );
    println!(
        "previous key accepted to: {}",
        unix(status.previous_accepted_until_unix_seconds)
    );
}

/// Runs a `cairn tokens` subcommand and prints its result.
pub async fn run(args: TokensArgs) -> anyhow::Result<()> {
    let client_args = &args.client;
    let (channel, credentials) = client_args.connect().await?;
    let mut client = TokensClient::with_interceptor(channel, credentials);
    let failed = |s: tonic::Status| client_args.failed(&s);
    match args.action {
        TokensAction::RotateKey { grace_secs } => {
            let reply = client
                .rotate_key(pb::RotateKeyRequest {
                    grace_seconds: grace_secs,
                })
                .await
                .map_err(failed)?
                .into_inner();
            let status = reply.status.unwrap_or_default();
            print(&status, "session-token key rotated", client_args.json);
        }
        TokensAction::Status => {
            let reply = client
                .key_status(pb::KeyStatusRequest {})
                .await
                .map_err(failed)?
                .into_inner();
            let status = reply.status.unwrap_or_default();
            print(&status, "session-token key", client_args.json);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<TokensArgs, String> {
        let argv = ["cairn", "tokens"].iter().chain(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Tokens(args) => Ok(args),
            other => Err(format!("not tokens: {other:?}")),
        }
    }

    #[test]
    fn rotate_key_takes_a_grace_period_and_client_port_flags_after_the_subcommand() {
        let args = parse(&[
            "rotate-key",
            "--grace-secs",
            "0",
            "--endpoint",
            "db:5005",
            "--password",
            "pw",
            "--tls-ca",
            "ca.pem",
        ])
        .expect("valid");
        assert!(matches!(
            args.action,
            TokensAction::RotateKey {
                grace_secs: Some(0)
            }
        ));
        assert_eq!(args.client.endpoint, "db:5005");
        assert_eq!(args.client.user, "admin");
        let status = parse(&["status"]).expect("valid");
        assert!(matches!(status.action, TokensAction::Status));
        assert_eq!(
            status.client.endpoint,
            crate::client_cli::DEFAULT_CLIENT_ENDPOINT
        );
    }

    #[test]
    fn a_client_certificate_needs_a_ca_and_a_key() {
        let error = parse(&["status", "--tls-cert", "c.pem"]).expect_err("no CA, no key");
        assert!(
            error.contains("--tls-ca") || error.contains("--tls-key"),
            "{error}"
        );
        assert!(parse(&["status", "--password", "a", "--password-file", "f"]).is_err());
    }
}
