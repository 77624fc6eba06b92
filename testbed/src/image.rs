//! Container images made here, with no registry: a root filesystem of the host's static
//! busybox, packed as `docker save` packs an image (one layer), for `ctr image import`.

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The static busybox the images are made of: `$GPUHOOK_TEST_BUSYBOX`, else Debian's
/// `busybox-static` (`/usr/bin/busybox`).
pub fn busybox() -> PathBuf {
    std::env::var_os("GPUHOOK_TEST_BUSYBOX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/busybox"))
}

/// The applets linked in an image's `/bin`.
const APPLETS: [&str; 16] = [
    "sh", "cat", "ls", "mknod", "stat", "echo", "sleep", "grep", "test", "[", "true", "rm",
    "touch", "ps", "kill", "wc",
];

/// A busybox root filesystem at `root/rootfs`.
pub fn busybox_rootfs(root: &Path) -> Result<PathBuf, String> {
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    let r = root.join("rootfs");
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run"] {
        std::fs::create_dir_all(r.join(d)).map_err(|e| io(&r.join(d), e))?;
    }
    let bb = busybox();
    std::fs::copy(&bb, r.join("bin/busybox"))
        .map_err(|e| format!("{} (Debian package busybox-static): {e}", bb.display()))?;
    for a in APPLETS {
        std::os::unix::fs::symlink("busybox", r.join("bin").join(a))
            .map_err(|e| io(&r.join("bin").join(a), e))?;
    }
    std::fs::write(r.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")
        .map_err(|e| io(&r.join("etc/passwd"), e))?;
    Ok(r)
}

fn run(c: &mut Command) -> Result<String, String> {
    let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{c:?}: {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn sha256(p: &Path) -> Result<String, String> {
    let out = run(Command::new("sha256sum").arg(p))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| format!("sha256sum {}: no sum", p.display()))
}

fn tar(dir: &Path, out: &Path) -> Result<(), String> {
    run(Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg("."))
    .map(|_| ())
}

/// What an image runs: its config's `Entrypoint` and `Cmd`.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

fn or_null(v: &[String]) -> serde_json::Value {
    if v.is_empty() {
        serde_json::Value::Null
    } else {
        json!(v)
    }
}

/// A `docker save`-shaped archive at `root/NAME.tar` of the busybox rootfs (one layer),
/// tagged `tag` (`gh-busybox:test`: `docker.io/library/gh-busybox:test` once imported).
pub fn busybox_tarball(root: &Path, tag: &str, r: &Run) -> Result<PathBuf, String> {
    let name = tag.replace([':', '/'], "-");
    let work = root.join(format!("{name}.d"));
    let img = work.join("image");
    std::fs::create_dir_all(&img).map_err(|e| format!("{}: {e}", img.display()))?;
    tar(&busybox_rootfs(&work)?, &img.join("layer.tar"))?;
    let config = json!({
        "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Entrypoint": or_null(&r.entrypoint), "Cmd": or_null(&r.cmd)},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256(&img.join("layer.tar"))?)]},
    });
    let c = img.join("config.json");
    std::fs::write(&c, config.to_string()).map_err(|e| format!("{}: {e}", c.display()))?;
    let cname = format!("{}.json", sha256(&c)?);
    std::fs::rename(&c, img.join(&cname)).map_err(|e| format!("{}: {e}", c.display()))?;
    std::fs::write(
        img.join("manifest.json"),
        json!([{"Config": cname, "RepoTags": [tag], "Layers": ["layer.tar"]}]).to_string(),
    )
    .map_err(|e| format!("manifest.json: {e}"))?;
    let t = root.join(format!("{name}.tar"));
    tar(&img, &t)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(t)
}
