//! Continuous archiving (`cairn serve --archive-to DEST`): the leader ships every committed
//! log entry to `DEST/<cluster id>/segments/` in segments, every `--archive-interval-secs`
//! (a backlog in segments of up to `--archive-segment-mib`), and records how far it got in
//! `DEST/<cluster id>/progress.json`, after the segment. Every member runs this task; the
//! members that do not lead read the progress and let their log go only behind it, so a new
//! leader has every entry the archive still lacks and goes on from where the progress
//! says. (Segments two leaders shipped for overlapping ranges hold the same entries: the
//! committed log is the same on every member.)
//!
//! An entry no member has any more when its turn comes (archiving turned on after the log
//! was purged, a member holding more than `--archive-max-held-entries` for an archive that
//! refused them) leaves a gap: counted in `cairn_archive_gaps_total`, logged, and refused
//! by restores that would need it. A base backup taken after the gap covers it.

use std::time::Instant;

use anyhow::Context;
use cairn_raft::archive::{Segment, segment_name};
use serde::{Deserialize, Serialize};

use crate::backup_target::Location;
use crate::config::ArchiveConfig;
use crate::state::{NodeState, unix_nanos};

/// Below `DEST/<cluster id>/`: the segments.
pub const SEGMENTS_DIR: &str = "segments";
/// Below `DEST/<cluster id>/`: how far the archive goes.
pub const PROGRESS_FILE: &str = "progress.json";
/// The archive of a cluster formed before clusters had ids.
pub const UNNAMED_CLUSTER: &str = "no-cluster-id";

/// What [`PROGRESS_FILE`] holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Format of this file, 1.
    pub format: u32,
    /// The cluster whose log this is.
    pub cluster_id: String,
    /// Every entry up to this index is in a segment.
    pub archived_through: u64,
    /// The member that wrote this.
    pub node_id: u64,
    /// When (Unix seconds).
    pub unix_seconds: i64,
}

/// The archive of cluster `cluster_id` below `dest`.
pub fn cluster_archive(dest: &Location, cluster_id: Option<&str>) -> Location {
    dest.join(cluster_id.unwrap_or(UNNAMED_CLUSTER))
}

/// How far the archive at `archive` goes, if it has begun.
pub async fn read_progress(archive: &Location) -> anyhow::Result<Option<Progress>> {
    match archive.get_whole(PROGRESS_FILE).await? {
        Some(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{}/{PROGRESS_FILE} is not an archive's progress",
                archive.display()
            )
        })?)),
        None => Ok(None),
    }
}

/// Starts the archiving task of this node. When `stop` is cancelled (at shutdown, once
/// in-flight writes are done) it ships what is left, if it leads, and ends.
pub fn spawn(
    node: std::sync::Arc<NodeState>,
    config: ArchiveConfig,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut archiver = Archiver {
            node,
            config,
            next: None,
            pending_since: None,
            archived_through: 0,
        };
        let mut tick = tokio::time::interval(archiver.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(to = %archiver.config.to.display(), "archiving committed log entries");
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    if archiver.node.raft.is_leader() {
                        archiver.round().await;
                    }
                    break;
                }
                _ = tick.tick() => {}
            }
            archiver.round().await;
        }
    })
}

struct Archiver {
    node: std::sync::Arc<NodeState>,
    config: ArchiveConfig,
    /// While leading: the next index to archive (`None`: not leading, or not known yet).
    next: Option<u64>,
    /// While leading: since when entries have been committed that the archive lacks.
    pending_since: Option<Instant>,
    /// The highest index the archive holds, as this node knows.
    archived_through: u64,
}

/// Runs blocking work on this node's Raft log (RocksDB) off the async workers.
async fn on_log<T: Send + 'static>(
    log: &cairn_raft::LogStore,
    work: impl FnOnce(&cairn_raft::LogStore) -> Result<T, Box<cairn_raft::StorageError>>
    + Send
    + 'static,
) -> anyhow::Result<T> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || work(&log))
        .await
        .context("the log task failed")?
        .map_err(|e| anyhow::anyhow!("{e}"))
}

impl Archiver {
    async fn round(&mut self) {
        let Some(cluster_id) = self.node.identity.id() else {
            // Not a member of any group yet: nothing committed to archive.
            return;
        };
        let archive = cluster_archive(&self.config.to, Some(&cluster_id));
        if !self.node.raft.is_leader() {
            self.next = None;
            self.pending_since = None;
            self.node.metrics.archive_lag.set(0.0);
            self.follow(&archive).await;
            return;
        }
        if let Err(e) = self.lead(&archive, &cluster_id).await {
            self.node
                .metrics
                .archive_segments
                .with_label_values(&["failed"])
                .inc();
            tracing::warn!(
                "failed to archive log entries to {}: {e:#}; retrying in {:?}",
                archive.display(),
                self.config.interval
            );
        }
        let lag = self
            .pending_since
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        self.node.metrics.archive_lag.set(lag);
    }

    /// Not leading: lets the log go behind what the archive holds.
    async fn follow(&mut self, archive: &Location) {
        match read_progress(archive).await {
            Ok(Some(progress)) => self.archived(progress.archived_through).await,
            Ok(None) => {}
            Err(e) => tracing::warn!("failed to read the archive's progress: {e:#}"),
        }
        if let Err(e) = self.release_excess().await {
            tracing::warn!("failed to let go of log entries held for the archive: {e:#}");
        }
    }

    /// The archive holds everything up to `through`.
    async fn archived(&mut self, through: u64) {
        self.archived_through = self.archived_through.max(through);
        self.node
            .metrics
            .archive_index
            .set(i64::try_from(self.archived_through).unwrap_or(i64::MAX));
        let released = on_log(self.node.raft.log_store(), move |log| {
            log.archived(through).map_err(Box::new)
        })
        .await;
        if let Err(e) = released {
            tracing::warn!(
                "failed to delete log entries up to {through} that the archive holds: {e:#}"
            );
        }
    }

    /// Lets held entries go beyond `--archive-max-held-entries`: the disk must not fill
    /// for an archive that takes nothing.
    async fn release_excess(&self) -> anyhow::Result<()> {
        let applied = self.node.raft.applied_index();
        let Some(held_from) = self.first_on_disk().await? else {
            return Ok(());
        };
        let archived = self.archived_through;
        if applied.saturating_sub(held_from.max(archived)) > self.config.max_held_entries {
            let through = applied - self.config.max_held_entries;
            tracing::error!(
                "the archive lags {} entries behind (more than --archive-max-held-entries {}): letting entries up to {through} go; the archive will have a gap",
                applied - archived,
                self.config.max_held_entries
            );
            on_log(self.node.raft.log_store(), move |log| {
                log.archived(through).map_err(Box::new)
            })
            .await?;
        }
        Ok(())
    }

    /// Leading: ships what is committed and not archived, in segments.
    async fn lead(&mut self, archive: &Location, cluster_id: &str) -> anyhow::Result<()> {
        let next = match self.next {
            Some(next) => next,
            None => {
                // Taking over: from where the archive's progress says (the previous
                // leader's), or from this log's first entry for a new archive.
                let next = match read_progress(archive).await? {
                    Some(progress) => progress.archived_through + 1,
                    None => self.first_on_disk().await?.unwrap_or(1),
                };
                tracing::info!(next, "archiving from log index {next}");
                self.next = Some(next);
                next
            }
        };
        let applied = self.node.raft.applied_index();
        if next > applied {
            self.pending_since = None;
            return Ok(());
        }
        let round_started = Instant::now();
        self.pending_since.get_or_insert(round_started);
        let mut next = next;
        while next <= applied {
            let segment_bytes = self.config.segment_bytes;
            let entries = on_log(self.node.raft.log_store(), move |log| {
                log.stored_entries(next, applied, segment_bytes)
                    .map_err(Box::new)
            })
            .await
            .with_context(|| format!("failed to read log entries from {next}"))?;
            let Some(&(first, _)) = entries.first() else {
                next = self.skip_gap(next).await?;
                self.next = Some(next);
                continue;
            };
            let last = entries.last().map_or(first, |e| e.0);
            let segment = Segment {
                cluster_id: cluster_id.to_string(),
                entries,
            };
            let bytes = segment.encode();
            let size = bytes.len() as u64;
            archive
                .put_whole(
                    &format!("{SEGMENTS_DIR}/{}", segment_name(first, last)),
                    bytes,
                )
                .await?;
            let progress = Progress {
                format: 1,
                cluster_id: cluster_id.to_string(),
                archived_through: last,
                node_id: self.node.config.node_id,
                unix_seconds: unix_nanos().div_euclid(1_000_000_000),
            };
            archive
                .put_whole(PROGRESS_FILE, serde_json::to_vec(&progress)?)
                .await?;
            let metrics = &self.node.metrics;
            metrics
                .archive_segments
                .with_label_values(&["succeeded"])
                .inc();
            metrics.archive_bytes.inc_by(size);
            tracing::debug!(first, last, size, "archived a segment");
            self.archived(last).await;
            next = last + 1;
            self.next = Some(next);
        }
        // Whatever was committed after `applied` was read has waited since then at most.
        self.pending_since = (self.node.raft.applied_index() >= next).then_some(round_started);
        Ok(())
    }

    async fn first_on_disk(&self) -> anyhow::Result<Option<u64>> {
        on_log(self.node.raft.log_store(), |log| {
            log.first_index_on_disk().map_err(Box::new)
        })
        .await
    }

    /// The log no longer has entry `missing`: goes on at the first entry it has.
    async fn skip_gap(&self, missing: u64) -> anyhow::Result<u64> {
        let resume = self
            .first_on_disk()
            .await?
            .filter(|first| *first > missing)
            .context("the log has no entry to archive next")?;
        self.node.metrics.archive_gaps.inc();
        tracing::error!(
            "the archive has a gap: log entries {missing}..{} are no longer on this node; restores to positions in them will be refused until a base backup taken from now on",
            resume - 1
        );
        Ok(resume)
    }
}
