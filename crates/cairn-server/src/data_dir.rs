//! The data directory's permissions (review M5).
//!
//! The directory holds the password hashes and the key that signs session tokens: anyone
//! who can read it can forge a token for any user. The `cairn` binary runs with umask 077,
//! so what it creates is 0700/0600; at start-up the directory itself is checked. One left
//! group- or world-accessible by an older version (which followed the umask, usually
//! 0755/0644) and owned by this user is tightened, with a warning; one owned by another
//! user is refused, unless `--allow-insecure-permissions` says the operator wants it so.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Bits nobody but the owner may have.
const GROUP_OR_OTHER: u32 = 0o077;

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// A filesystem call failed.
    #[error("failed to {what} {path}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// On what.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// Accessible to others and not ours to fix.
    #[error(
        "data directory {path} is accessible to other users (mode {mode:04o}) and owned by uid {owner}, not this process's uid {uid}: it holds password hashes and the token-signing key. Run `chmod -R go-rwx {path}` as its owner, or pass --allow-insecure-permissions"
    )]
    Insecure {
        /// The directory.
        path: String,
        /// Its mode bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// Ours.
        uid: u32,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DataDirError + 'a {
    move |source| DataDirError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Creates `dir` (0700) if missing, and makes sure nobody but its owner can reach it.
pub fn prepare(dir: &Path, allow_insecure: bool) -> Result<(), DataDirError> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("create", dir))?;
    }
    let meta = std::fs::metadata(dir).map_err(io("read the permissions of", dir))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & GROUP_OR_OTHER == 0 {
        return Ok(());
    }
    if allow_insecure {
        tracing::warn!(
            "data directory {} is accessible to other users (mode {mode:04o}); kept so because of --allow-insecure-permissions",
            dir.display()
        );
        return Ok(());
    }
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(DataDirError::Insecure {
            path: dir.display().to_string(),
            mode,
            owner: meta.uid(),
            uid,
        });
    }
    let changed = tighten(dir)?;
    tracing::warn!(
        "data directory {} was accessible to other users (mode {mode:04o}): removed their access to it and {changed} entries below it",
        dir.display()
    );
    Ok(())
}

/// Removes group and other access from `dir` and everything below it (not following
/// symbolic links); returns how many entries below it changed.
fn tighten(dir: &Path) -> Result<usize, DataDirError> {
    let mut changed = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta =
            std::fs::symlink_metadata(&path).map_err(io("read the permissions of", &path))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & GROUP_OR_OTHER != 0 {
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(mode & !GROUP_OR_OTHER & 0o7777),
            )
            .map_err(io("change the permissions of", &path))?;
            if path != dir {
                changed += 1;
            }
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(io("list", &path))? {
                pending.push(entry.map_err(io("list", &path))?.path());
            }
        }
    }
    Ok(changed)
}

/// Makes every file the process creates from here on private to its user (0600 files,
/// 0700 directories). For the `cairn` binary; an embedding program keeps its own umask.
pub fn private_umask() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn a_new_directory_is_private() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b/data");
        prepare(&dir, false).expect("created");
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn an_open_directory_of_ours_is_tightened_all_the_way_down() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("db")).expect("mkdir");
        std::fs::write(dir.join("db/CURRENT"), b"x").expect("write");
        for (path, mode) in [(&dir, 0o755), (&dir.join("db"), 0o775)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        std::fs::set_permissions(
            dir.join("db/CURRENT"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        prepare(&dir, false).expect("tightened");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("db")), 0o700);
        assert_eq!(mode(&dir.join("db/CURRENT")), 0o600);
    }

    #[test]
    fn an_open_directory_of_another_user_is_refused() {
        if rustix::process::geteuid().as_raw() != 0 {
            // Only root can hand a directory to another user.
            return;
        }
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown");
        let err = prepare(&dir, false).expect_err("refused");
        assert!(
            err.to_string().contains("--allow-insecure-permissions"),
            "{err}"
        );
        assert_eq!(mode(&dir), 0o755, "left as it was");
    }

    #[test]
    fn the_override_keeps_an_open_directory_as_it_is() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        prepare(&dir, true).expect("allowed");
        assert_eq!(mode(&dir), 0o750);
    }
}
