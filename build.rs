//! Records the commit the broker is built from as `FERRY_BUILD_COMMIT` (`git rev-parse
//! --short HEAD`; `unknown` without git or outside a repository), for `ferrymq --version`
//! and the start-up log. The build script runs again when HEAD moves. (Not `FERRYMQ_...`:
//! cargo passes the variable on to the test binaries, and the broker they start would
//! read it as a configuration key.)

use std::path::Path;
use std::process::Command;

/// The trimmed output of a successful `git` command.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Asks cargo to run this script again when `path` changes (only files that exist: a
/// missing one would make every build run it).
fn watch(path: &str) {
    if Path::new(path).exists() {
        println!("cargo:rerun-if-changed={path}");
    }
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FERRY_BUILD_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    // HEAD (a worktree has its own), the branch it names and the packed refs.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watch(&format!("{dir}/HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        watch(&format!("{common}/packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(&format!("{common}/{branch}"));
        }
    }
}
