//! Where backups are kept: a directory, or a bucket of S3 or of any S3-compatible store.
//!
//! Both hold the same layout: `DEST/NAME/manifest.json` beside `DEST/NAME/db/…`, the
//! manifest written last, so a backup without one is incomplete however it was cut off.
//! In a bucket the manifest is one PUT, which S3 makes visible whole or not at all; large
//! files go up as multipart uploads, which S3 shows only once completed. Reading a
//! backup from a bucket (verify, restore) downloads it into a local directory first:
//! RocksDB opens files, not objects.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use cairn_store::backup::{self as store_backup, MANIFEST_FILE, Manifest};
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// Default size of each part of a multipart upload, in MiB: a file larger than one part
/// goes up in parts, a smaller one in a single PUT.
pub const DEFAULT_UPLOAD_PART_MIB: u64 = 16;
/// S3's bounds on a part (all but the last): 5 MiB to 5 GiB.
const UPLOAD_PART_MIB_RANGE: std::ops::RangeInclusive<u64> = 5..=5120;
/// Parts of one file in flight at once (memory: this many parts per file being written).
const UPLOAD_CONCURRENCY: usize = 4;

/// How to reach an S3-compatible store (with the standard AWS environment variables:
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, and
/// web identity or instance credentials where those are set up).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct S3Args {
    /// Endpoint of an S3-compatible store for s3:// locations (e.g. http://minio:9000);
    /// AWS S3 itself when unset (`AWS_ENDPOINT_URL` is read too).
    #[arg(long, env = "CAIRN_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Size in MiB of each part of a multipart upload (S3 allows 5 to 5120); files up to
    /// one part go up in a single PUT. Memory: up to 4 parts in flight.
    #[arg(long, env = "CAIRN_S3_PART_MIB", default_value_t = DEFAULT_UPLOAD_PART_MIB,
          value_parser = clap::value_parser!(u64).range(*UPLOAD_PART_MIB_RANGE.start()..=*UPLOAD_PART_MIB_RANGE.end()))]
    pub s3_part_mib: u64,
}

/// A bucket and a key prefix in it.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    /// Key prefix without leading or trailing '/', maybe empty.
    prefix: String,
    part_bytes: usize,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.url())
    }
}

impl Bucket {
    fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    fn key(&self, rel: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rel)
        } else {
            ObjectPath::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn join(&self, name: &str) -> Bucket {
        Bucket {
            store: self.store.clone(),
            bucket: self.bucket.clone(),
            prefix: if self.prefix.is_empty() {
                name.to_string()
            } else {
                format!("{}/{name}", self.prefix)
            },
            part_bytes: self.part_bytes,
        }
    }

    /// Whether any object lies below this prefix.
    async fn holds_anything(&self) -> anyhow::Result<bool> {
        let prefix = self.key("");
        let mut listing = self.store.list(Some(&prefix));
        match listing.next().await {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(e).with_context(|| format!("failed to list {}", self.url())),
        }
    }

    async fn manifest(&self) -> anyhow::Result<Option<Manifest>> {
        let Some(bytes) = self.get(MANIFEST_FILE).await? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        let source = format!("{}/{MANIFEST_FILE}", self.url());
        Ok(Some(Manifest::from_json(&text, &source)?))
    }

    /// The object at `rel` below the prefix; `None` if there is none.
    async fn get(&self, rel: &str) -> anyhow::Result<Option<Bytes>> {
        let failed = || format!("failed to read {}/{rel}", self.url());
        match self.store.get(&self.key(rel)).await {
            Ok(got) => Ok(Some(got.bytes().await.with_context(failed)?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(failed),
        }
    }
}

/// A directory or bucket prefix that holds backups, or one backup.
#[derive(Debug, Clone)]
pub enum Location {
    Dir(PathBuf),
    Bucket(Bucket),
}

impl Location {
    /// A directory, or `s3://BUCKET[/PREFIX]`.
    pub fn parse(text: &str, s3: &S3Args) -> anyhow::Result<Location> {
        let Some((scheme, rest)) = text.split_once("://") else {
            if text.is_empty() {
                bail!("an empty location: give a directory or s3://BUCKET/PREFIX");
            }
            return Ok(Location::Dir(PathBuf::from(text)));
        };
        if scheme != "s3" {
            bail!(
                "{text:?}: {scheme}:// locations are not supported; give a directory or s3://BUCKET/PREFIX (S3-compatible stores via --s3-endpoint)"
            );
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            bail!("{text:?} names no bucket: s3://BUCKET/PREFIX");
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|part| part == "." || part == "..") || prefix.contains("//") {
            bail!("{text:?}: a key prefix has no empty, '.' or '..' parts");
        }
        Ok(Location::Bucket(Bucket {
            store: Arc::new(open_bucket(bucket, s3)?),
            bucket: bucket.to_string(),
            prefix,
            part_bytes: usize::try_from(s3.s3_part_mib * 1024 * 1024).unwrap_or(usize::MAX),
        }))
    }

    /// The backup called `name` below this location.
    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Dir(dir) => Location::Dir(dir.join(name)),
            Location::Bucket(bucket) => Location::Bucket(bucket.join(name)),
        }
    }

    /// The last component of the location: a backup's name.
    pub fn name(&self) -> String {
        match self {
            Location::Dir(dir) => dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Location::Bucket(bucket) => bucket
                .prefix
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// The location as a user writes it.
    pub fn display(&self) -> String {
        match self {
            Location::Dir(dir) => dir.display().to_string(),
            Location::Bucket(bucket) => bucket.url(),
        }
    }

    /// Writes one whole object (a file) at `rel` below this location: readers see all of
    /// it or nothing (a directory's file is written to a temporary name, synced and
    /// renamed; an object is one PUT).
    pub async fn put_whole(&self, rel: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        match self {
            Location::Dir(dir) => {
                let path = dir.join(rel);
                tokio::task::spawn_blocking(move || {
                    if let Some(parent) = path.parent() {
                        fs::create_dir_all(parent)
                            .with_context(|| format!("failed to create {}", parent.display()))?;
                    }
                    cairn_store::write_file_durably(&path, &bytes)
                        .with_context(|| format!("failed to write {}", path.display()))
                })
                .await
                .context("the write task failed")?
            }
            Location::Bucket(bucket) => {
                let key = bucket.key(rel);
                bucket
                    .store
                    .put(&key, PutPayload::from(Bytes::from(bytes)))
                    .await
                    .with_context(|| format!("failed to upload {}/{rel}", bucket.url()))?;
                Ok(())
            }
        }
    }

    /// The object (file) at `rel` below this location; `None` if there is none.
    pub async fn get_whole(&self, rel: &str) -> anyhow::Result<Option<Vec<u8>>> {
        match self {
            Location::Dir(dir) => match fs::read(dir.join(rel)) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => {
                    Err(e).with_context(|| format!("failed to read {}", dir.join(rel).display()))
                }
            },
            Location::Bucket(bucket) => Ok(bucket.get(rel).await?.map(|b| b.to_vec())),
        }
    }

    /// The names of the objects (files) directly below `rel`, sorted; none if it is missing.
    pub async fn names_below(&self, rel: &str) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        match self {
            Location::Dir(dir) => {
                let dir = dir.join(rel);
                let entries = match fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
                    Err(e) => {
                        return Err(e).with_context(|| format!("failed to list {}", dir.display()));
                    }
                };
                for entry in entries {
                    let entry =
                        entry.with_context(|| format!("failed to list {}", dir.display()))?;
                    if entry.file_type().is_ok_and(|t| t.is_file()) {
                        names.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
            }
            Location::Bucket(bucket) => {
                let prefix = bucket.key(rel);
                let listing = bucket
                    .store
                    .list_with_delimiter(Some(&prefix))
                    .await
                    .with_context(|| format!("failed to list {}/{rel}", bucket.url()))?;
                for object in listing.objects {
                    if let Some(name) = object.location.filename() {
                        names.push(name.to_string());
                    }
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The backups below this location by name, sorted, each with its manifest or why it
    /// is not complete.
    pub async fn backups(&self) -> anyhow::Result<Vec<(String, Result<Manifest, String>)>> {
        let mut names = Vec::new();
        match self {
            Location::Dir(dir) => {
                for entry in fs::read_dir(dir)
                    .with_context(|| format!("failed to list {}", dir.display()))?
                {
                    let entry =
                        entry.with_context(|| format!("failed to list {}", dir.display()))?;
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        names.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
            }
            Location::Bucket(bucket) => {
                let prefix = (!bucket.prefix.is_empty()).then(|| bucket.key(""));
                let listing = bucket
                    .store
                    .list_with_delimiter(prefix.as_ref())
                    .await
                    .with_context(|| format!("failed to list {}", bucket.url()))?;
                for common in listing.common_prefixes {
                    if let Some(name) = common.filename() {
                        names.push(name.to_string());
                    }
                }
            }
        }
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let manifest = match self.join(&name) {
                Location::Dir(dir) => store_backup::read_manifest(&dir).map_err(|e| e.to_string()),
                Location::Bucket(backup) => match backup.manifest().await {
                    Ok(Some(manifest)) => Ok(manifest),
                    Ok(None) => Err(format!(
                        "{}/{MANIFEST_FILE} is missing: the backup was cut off before it ended",
                        backup.url()
                    )),
                    Err(e) => Err(format!("{e:#}")),
                },
            };
            out.push((name, manifest));
        }
        Ok(out)
    }

    /// Removes the backup at this location, complete or not: its manifest first, so it
    /// stops being complete before any of its files go. Refuses, deleting nothing, a
    /// location that holds anything a backup does not (`manifest.json` and `db/…`):
    /// a mistyped `--from` must never empty a directory or a bucket. Returns how many
    /// files or objects went.
    pub async fn delete(&self) -> anyhow::Result<u64> {
        match self {
            Location::Dir(dir) => {
                let entries: Vec<String> = fs::read_dir(dir)
                    .with_context(|| format!("{} is not a backup directory", dir.display()))?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("failed to list {}", dir.display()))?;
                if entries.is_empty() {
                    bail!("{} holds no backup", dir.display());
                }
                if let Some(other) = entries.iter().find(|e| !is_backup_entry(e)) {
                    bail!(
                        "{} is not a backup: it holds {other:?}, which no backup does (nothing was deleted)",
                        dir.display()
                    );
                }
                let manifest = dir.join(MANIFEST_FILE);
                let had_manifest = manifest.exists();
                if had_manifest {
                    fs::remove_file(&manifest)
                        .map_err(anyhow::Error::from)
                        .and_then(|()| cairn_store::sync_dir(dir).map_err(anyhow::Error::from))
                        .with_context(|| format!("failed to remove {}", manifest.display()))?;
                }
                let files = store_backup::list_files(dir)?.len() as u64;
                fs::remove_dir_all(dir)
                    .with_context(|| format!("failed to remove {}", dir.display()))?;
                if let Some(parent) = dir.parent() {
                    cairn_store::sync_dir(parent)?;
                }
                Ok(files + u64::from(had_manifest))
            }
            Location::Bucket(backup) => {
                if backup.prefix.is_empty() {
                    bail!(
                        "{}: name the backup (s3://BUCKET/PREFIX/NAME), not the bucket",
                        backup.url()
                    );
                }
                let prefix = backup.key("");
                let keys: Vec<ObjectPath> = backup
                    .store
                    .list(Some(&prefix))
                    .map(|meta| meta.map(|m| m.location))
                    .collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("failed to list {}", backup.url()))?;
                if keys.is_empty() {
                    bail!("{} holds no backup", backup.url());
                }
                let below = |key: &ObjectPath| {
                    key.as_ref()
                        .strip_prefix(prefix.as_ref())
                        .map(|rest| rest.trim_start_matches('/').to_string())
                        .unwrap_or_default()
                };
                if let Some(other) = keys
                    .iter()
                    .map(below)
                    .find(|rel| !is_backup_entry(rel.split('/').next().unwrap_or_default()))
                {
                    bail!(
                        "{} is not a backup: it holds {other:?}, which no backup does (nothing was deleted)",
                        backup.url()
                    );
                }
                let manifest = backup.key(MANIFEST_FILE);
                match backup.store.delete(&manifest).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("failed to delete {}/{MANIFEST_FILE}", backup.url())
                        });
                    }
                }
                let n = keys.len() as u64;
                for key in keys.into_iter().filter(|k| *k != manifest) {
                    backup
                        .store
                        .delete(&key)
                        .await
                        .with_context(|| format!("failed to delete {key}"))?;
                }
                Ok(n)
            }
        }
    }

    /// The backup at this location in a local directory: the directory itself, or a copy
    /// downloaded into a new directory below `scratch` (each file checked against the
    /// manifest's SHA-256 on arrival, the manifest written last). `progress` hears of
    /// every downloaded chunk's size, after the manifest's total.
    pub async fn local_copy(
        &self,
        scratch: &Path,
        progress: &mut dyn FnMut(Transfer),
    ) -> anyhow::Result<LocalCopy> {
        let backup = match self {
            Location::Dir(dir) => return Ok(LocalCopy::InPlace(dir.clone())),
            Location::Bucket(backup) => backup,
        };
        let Some(manifest) = backup.manifest().await? else {
            bail!(
                "{}/{MANIFEST_FILE} is missing: no complete backup there (`cairn backup list` shows what is)",
                backup.url()
            );
        };
        fs::create_dir_all(scratch)
            .with_context(|| format!("failed to create {}", scratch.display()))?;
        let dir = tempfile::Builder::new()
            .prefix(".cairn-download-")
            .tempdir_in(scratch)
            .with_context(|| format!("failed to create a directory in {}", scratch.display()))?;
        progress(Transfer::Started(manifest.total_bytes()));
        for file in &manifest.files {
            if !store_backup::valid_file_path(&file.path) {
                bail!(
                    "{}/{MANIFEST_FILE} names an unexpected file path {:?}",
                    backup.url(),
                    file.path
                );
            }
            let to = dir.path().join(&file.path);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("failed to create {}", parent.display()))?;
            }
            let key = backup.key(&file.path);
            let got = backup
                .store
                .get(&key)
                .await
                .with_context(|| format!("failed to download {key}"))?;
            let mut out = File::create_new(&to)
                .with_context(|| format!("failed to create {}", to.display()))?;
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let mut chunks = got.into_stream();
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.with_context(|| format!("failed to download {key}"))?;
                out.write_all(&chunk)
                    .with_context(|| format!("failed to write {}", to.display()))?;
                hasher.update(&chunk);
                size += chunk.len() as u64;
                progress(Transfer::Moved(chunk.len() as u64));
            }
            let sha256 = store_backup::hex(&hasher.finalize());
            if size != file.size || sha256 != file.sha256 {
                bail!(
                    "{key} is damaged: {size} bytes with SHA-256 {sha256}, the manifest says {} bytes with {}",
                    file.size,
                    file.sha256
                );
            }
            out.sync_all()
                .with_context(|| format!("failed to sync {}", to.display()))?;
        }
        store_backup::write_manifest(dir.path(), &manifest)?;
        progress(Transfer::Done);
        Ok(LocalCopy::Downloaded(dir))
    }
}

/// What a transfer has done, for a progress display.
#[derive(Debug, Clone, Copy)]
pub enum Transfer {
    /// This many bytes are to come.
    Started(u64),
    /// This many more arrived.
    Moved(u64),
    Done,
}

/// A backup on local disk: where it was, or a download removed when dropped.
pub enum LocalCopy {
    InPlace(PathBuf),
    Downloaded(tempfile::TempDir),
}

impl LocalCopy {
    pub fn path(&self) -> &Path {
        match self {
            LocalCopy::InPlace(dir) => dir,
            LocalCopy::Downloaded(dir) => dir.path(),
        }
    }
}

fn open_bucket(bucket: &str, s3: &S3Args) -> anyhow::Result<object_store::aws::AmazonS3> {
    // reqwest is built without a crypto provider of its own: it uses the process default,
    // ring, as everything else here (no second TLS implementation to build or audit).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        builder = builder.with_region("us-east-1");
    }
    // An endpoint the user named may be plain HTTP (a MinIO beside the node); AWS itself
    // is reached over HTTPS only.
    let endpoint = s3
        .s3_endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT").ok());
    if let Some(endpoint) = endpoint {
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint);
    }
    builder
        .build()
        .with_context(|| format!("cannot reach bucket {bucket:?}"))
}

/// A backup being written, file by file, then committed with its manifest.
pub enum BackupWriter {
    Dir(PathBuf),
    Bucket(Bucket),
}

/// One file of a backup being written.
pub enum FileWriter {
    Local(File, PathBuf),
    Remote(Box<BufWriter>, ObjectPath),
}

impl BackupWriter {
    /// Starts a backup at `location`, which must not hold one (or anything) yet.
    pub async fn start(location: &Location) -> anyhow::Result<BackupWriter> {
        match location {
            Location::Dir(dir) => {
                if let Some(parent) = dir.parent() {
                    fs::create_dir_all(parent)
                        .with_context(|| format!("failed to create {}", parent.display()))?;
                }
                fs::create_dir(dir).with_context(|| {
                    format!(
                        "failed to create {}: a backup of that name exists already? (--name picks another)",
                        dir.display()
                    )
                })?;
                Ok(BackupWriter::Dir(dir.clone()))
            }
            Location::Bucket(bucket) => {
                if bucket.holds_anything().await? {
                    bail!(
                        "{} holds objects already: a backup of that name exists? (--name picks another)",
                        bucket.url()
                    );
                }
                Ok(BackupWriter::Bucket(bucket.clone()))
            }
        }
    }

    /// Opens the file at `rel` (a path the manifest may name).
    pub fn open(&self, rel: &str) -> anyhow::Result<FileWriter> {
        match self {
            BackupWriter::Dir(dir) => {
                let path = dir.join(rel);
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent)
                        .with_context(|| format!("failed to create {}", parent.display()))?;
                }
                let file = File::create_new(&path)
                    .with_context(|| format!("failed to create {}", path.display()))?;
                Ok(FileWriter::Local(file, path))
            }
            BackupWriter::Bucket(bucket) => {
                let key = bucket.key(rel);
                let writer =
                    BufWriter::with_capacity(bucket.store.clone(), key.clone(), bucket.part_bytes)
                        .with_max_concurrency(UPLOAD_CONCURRENCY);
                Ok(FileWriter::Remote(Box::new(writer), key))
            }
        }
    }

    /// Makes the backup complete: everything it holds durable, then its manifest.
    pub async fn commit(&self, manifest: &Manifest) -> anyhow::Result<()> {
        match self {
            BackupWriter::Dir(dir) => {
                for sub in dirs_below(dir)? {
                    cairn_store::sync_dir(&sub)?;
                }
                store_backup::write_manifest(dir, manifest)?;
                Ok(())
            }
            BackupWriter::Bucket(bucket) => {
                let key = bucket.key(MANIFEST_FILE);
                bucket
                    .store
                    .put(&key, PutPayload::from(manifest.to_json().into_bytes()))
                    .await
                    .with_context(|| format!("failed to upload {key}"))?;
                Ok(())
            }
        }
    }

    /// Where this backup is.
    pub fn display(&self) -> String {
        match self {
            BackupWriter::Dir(dir) => dir.display().to_string(),
            BackupWriter::Bucket(bucket) => bucket.url(),
        }
    }
}

impl FileWriter {
    pub async fn write(&mut self, data: Vec<u8>) -> anyhow::Result<()> {
        match self {
            FileWriter::Local(file, path) => file
                .write_all(&data)
                .with_context(|| format!("failed to write {}", path.display())),
            FileWriter::Remote(writer, key) => writer
                .put(Bytes::from(data))
                .await
                .with_context(|| format!("failed to upload {key}")),
        }
    }

    /// The file is whole: durable on disk, or its upload completed.
    pub async fn finish(self) -> anyhow::Result<()> {
        match self {
            FileWriter::Local(file, path) => file
                .sync_all()
                .with_context(|| format!("failed to sync {}", path.display())),
            FileWriter::Remote(mut writer, key) => writer
                .shutdown()
                .await
                .with_context(|| format!("failed to upload {key}")),
        }
    }

    /// Gives up on the file: an upload in parts is aborted (S3 keeps nothing of it).
    pub async fn abort(self) {
        if let FileWriter::Remote(mut writer, key) = self
            && let Err(e) = writer.abort().await
        {
            tracing::warn!("failed to abort the upload of {key}: {e}");
        }
    }
}

/// Whether a top-level entry of a backup's directory or prefix is one a backup holds.
fn is_backup_entry(name: &str) -> bool {
    name == MANIFEST_FILE || name == store_backup::DB_DIR || name == store_backup::VERIFIED_FILE
}

/// `dir` and every directory below it.
fn dirs_below(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let here = out[i].clone();
        for entry in
            fs::read_dir(&here).with_context(|| format!("failed to list {}", here.display()))?
        {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                out.push(entry.path());
            }
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3() -> S3Args {
        S3Args {
            s3_endpoint: Some("http://127.0.0.1:1".into()),
            s3_part_mib: DEFAULT_UPLOAD_PART_MIB,
        }
    }

    #[test]
    fn a_location_is_a_directory_or_an_s3_bucket_and_prefix() {
        match Location::parse("/backups", &s3()).expect("dir") {
            Location::Dir(dir) => assert_eq!(dir, PathBuf::from("/backups")),
            other => panic!("{other:?}"),
        }
        match Location::parse("s3://bucket/team/db/", &s3()).expect("bucket") {
            Location::Bucket(b) => {
                assert_eq!(
                    (b.bucket.as_str(), b.prefix.as_str()),
                    ("bucket", "team/db")
                );
                assert_eq!(b.url(), "s3://bucket/team/db");
                assert_eq!(
                    b.join("n").key(MANIFEST_FILE).as_ref(),
                    "team/db/n/manifest.json"
                );
            }
            other => panic!("{other:?}"),
        }
        match Location::parse("s3://bucket", &s3()).expect("bucket") {
            Location::Bucket(b) => {
                assert_eq!(b.url(), "s3://bucket");
                assert_eq!(b.join("n").url(), "s3://bucket/n");
                assert_eq!(b.key("x").as_ref(), "x");
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "",
            "gs://bucket/x",
            "s3://",
            "s3:///x",
            "s3://b/a/../c",
            "s3://b/a//c",
        ] {
            assert!(Location::parse(bad, &s3()).is_err(), "{bad:?}");
        }
        let e = Location::parse("gs://b", &s3()).expect_err("gs");
        assert!(
            e.to_string().contains("gs:// locations are not supported"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn delete_takes_a_backup_directory_and_nothing_else() {
        let root = tempfile::tempdir().expect("dir");
        let backup = root.path().join("b");
        fs::create_dir_all(backup.join("db")).expect("mkdir");
        fs::write(backup.join("db/000001.sst"), b"t").expect("write");
        fs::write(backup.join(MANIFEST_FILE), b"{}").expect("write");
        let holder = Location::Dir(root.path().to_path_buf());
        let e = holder
            .delete()
            .await
            .expect_err("the directory holding backups");
        assert!(e.to_string().contains("is not a backup"), "{e}");
        assert!(backup.join("db/000001.sst").exists(), "nothing was deleted");
        let removed = Location::Dir(backup.clone())
            .delete()
            .await
            .expect("delete");
        assert_eq!(removed, 2);
        assert!(!backup.exists());
        let e = Location::Dir(backup).delete().await.expect_err("gone");
        assert!(e.to_string().contains("is not a backup directory"), "{e}");
    }
}
