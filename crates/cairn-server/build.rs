//! Bakes the source revision into the binary for GetServerInfo (`git_commit`), when the
//! build runs inside a git checkout. `CAIRN_GIT_COMMIT` / `CAIRN_BUILD_TIME` set in the
//! environment win (release pipelines); otherwise the values are "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CAIRN_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=CAIRN_BUILD_TIME");
    if std::env::var("CAIRN_GIT_COMMIT").is_err() {
        let head = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        if let Some(head) = head {
            println!("cargo:rustc-env=CAIRN_GIT_COMMIT={head}");
        }
        let git_dir = Command::new("git")
            .args(["rev-parse", "--git-dir"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string());
        if let Some(dir) = git_dir {
            let dir = std::path::Path::new(&dir);
            let dir = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
                    .join(dir)
            };
            println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
            println!("cargo:rerun-if-changed={}", dir.join("refs").display());
        }
    }
}
