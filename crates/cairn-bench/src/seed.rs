//! Seeding: the boundary must hold the seed events before scenarios run
//! (`benchmark_context = "seed-<i % contexts>"`, 10 events per context).

use std::time::Instant;

use anyhow::{Context, bail};
use cairn_proto::orisun as pb;
use indicatif::{ProgressBar, ProgressStyle};
use tonic::Code;

use cairn_client::{Client, ClientConfig, NewEvent};

use crate::client::{ConnectOptions, Connection};
use crate::scenario::{EVENTS_PER_SEED_CONTEXT, event, seed_context};

/// What the scenarios may rely on.
#[derive(Debug, Clone, Copy)]
pub struct Seeded {
    /// Events in the boundary.
    pub events: u64,
    /// Seeded contexts (`seed-0` … `seed-<contexts-1>`).
    pub contexts: u64,
}

/// Writers used for seeding.
const SEED_WRITERS: usize = 4;

/// Creates the boundary if missing and tops it up to `target` events.
pub async fn ensure(
    admin: &Connection,
    boundary: &str,
    target: u64,
    batch: usize,
    connect: &ConnectOptions,
    progress: bool,
) -> anyhow::Result<Seeded> {
    let mut a = admin.admin.clone();
    match a
        .create_boundary(pb::CreateBoundaryRequest {
            name: boundary.to_string(),
            description: "cairn-bench".to_string(),
            ..Default::default()
        })
        .await
    {
        Ok(_) => {}
        Err(status) if status.code() == Code::AlreadyExists => {}
        Err(status) => bail!("CreateBoundary {boundary}: {status}"),
    }
    let count = a
        .get_event_count(pb::GetEventCountRequest {
            boundary: boundary.to_string(),
        })
        .await
        .context("GetEventCount")?
        .into_inner()
        .count as u64;
    let contexts = (target / EVENTS_PER_SEED_CONTEXT).max(1);
    if count >= target {
        return Ok(Seeded {
            events: count,
            contexts,
        });
    }
    let bar = if progress {
        let bar = ProgressBar::new(target);
        bar.set_style(
            ProgressStyle::with_template(
                "seeding {bar:40} {pos}/{len} events ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_position(count);
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let writes: Vec<(u64, u64)> = (count..target)
        .step_by(batch)
        .map(|from| (from, (from + batch as u64).min(target)))
        .collect();
    let chunk = writes.len().div_ceil(SEED_WRITERS).max(1);
    let mut tasks = Vec::new();
    for (w, part) in writes.chunks(chunk).enumerate() {
        let part = part.to_vec();
        // Seeding is not measured: it goes through cairn-client, whose failover carries it
        // over a node that restarts or loses leadership meanwhile.
        let client = seed_client(connect, w)?;
        let boundary = boundary.to_string();
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            for (from, to) in part {
                let events: Vec<NewEvent> = (from..to)
                    .map(|i| {
                        let e = event(&seed_context(i % contexts), (i - from) as usize, i);
                        NewEvent {
                            id: e.event_id,
                            event_type: e.event_type,
                            data: e.data,
                            metadata: e.metadata,
                        }
                    })
                    .collect();
                client
                    .append(&boundary, &events, &[])
                    .await
                    .with_context(|| format!("seed write at {from}"))?;
                bar.inc(to - from);
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await.context("seed writer panicked")??;
    }
    bar.finish_and_clear();
    eprintln!(
        "seeded {} events into {boundary} in {:.1}s",
        target - count,
        started.elapsed().as_secs_f64()
    );
    Ok(Seeded {
        events: target,
        contexts,
    })
}

/// A client for seed writer `w`, starting on endpoint `w` (round-robin) and failing over to
/// the others.
fn seed_client(connect: &ConnectOptions, w: usize) -> anyhow::Result<Client> {
    let mut endpoints = connect.endpoints.clone();
    let first = w % endpoints.len().max(1);
    endpoints.rotate_left(first);
    let mut config = ClientConfig::new(endpoints)
        .in_order()
        .credentials(connect.user.clone(), connect.password.clone());
    if let Some(ca) = &connect.tls.ca {
        config = config.tls_ca_certificate(ca.clone());
    }
    if let Some((cert, key)) = &connect.tls.identity {
        config = config.tls_client_identity(cert.clone(), key.clone());
    }
    Ok(Client::new(config)?)
}
