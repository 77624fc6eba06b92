//! The facts the docs state, each against where it lives: config keys (fed to the config
//! loader, which refuses an unknown key), the files the packages install (the asset lists in
//! `Cargo.toml` and the maintainer scripts), links and their anchors, the request's
//! annotation keys (`gpuhook::request::oci::KEYS`).

use super::markdown::{words, Doc};
use std::collections::BTreeSet;
use std::path::Path;

// ---- config keys ----

/// The config loader's top-level keys: what it says when it refuses one it does not know.
pub fn config_keys() -> Vec<String> {
    let e = gpuhook::host::config::Config::parse(r#"{"no such key": 0}"#, Path::new("x"))
        .expect_err("an unknown key is refused")
        .to_string();
    let list = e
        .split("expected one of ")
        .nth(1)
        .expect("the loader lists its keys");
    list.split(", ")
        .map(|k| k.split('`').nth(1).expect("a key in backticks").to_owned())
        .collect()
}

/// A config (or a fragment of one: `"key": value, …`) as the loader reads it.
pub fn load(text: &str) -> Result<(), String> {
    let t = text.trim();
    let t = if t.starts_with('{') {
        t.to_owned()
    } else {
        format!("{{{t}}}")
    };
    gpuhook::host::config::Config::parse(&t, Path::new("the doc's config"))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The key a prose span names as a config key: `` config `key` ``, `` config's `key` ``,
/// `` (config key `key`) ``, or a JSON member `` `"key": value` ``.
pub fn config_mentions(doc: &Doc) -> Vec<(usize, String, Option<String>)> {
    let mut v = Vec::new();
    for s in &doc.spans {
        let b = s.before.trim_end().to_lowercase();
        let said = ["config", "config's", "config key", "config keys", "(config"]
            .iter()
            .any(|w| b.ends_with(w));
        let key = s
            .text
            .strip_prefix('"')
            .and_then(|t| t.split_once("\": "))
            .map(|(k, _)| k);
        let key = key.filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        // A JSON member (`"auto_reset": true`); a sketch of a schema (`{"mode", …}`) is not one.
        let json = serde_json::from_str::<serde_json::Value>(&format!("{{{}}}", s.text)).is_ok();
        if let (Some(key), true) = (key, json) {
            v.push((s.line, key.to_owned(), Some(s.text.clone())));
        } else if said {
            let key = s.text.trim().to_owned();
            if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !key.is_empty() {
                v.push((s.line, key, None));
            }
        }
    }
    v
}

// ---- the packages' files ----

/// What a package installs, and how.
pub struct Installed {
    pub deb: Vec<String>,
    pub rpm: Vec<String>,
    /// Made by the maintainer scripts (the hook's links, the `.rpm`'s runtime link).
    pub scripts: Vec<String>,
}

fn quoted_strings(line: &str) -> Vec<String> {
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The assets of `Cargo.toml`'s `[package.metadata.deb]` and `[package.metadata.generate-rpm]`.
pub fn installed(root: &Path) -> Installed {
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let (mut deb, mut rpm, mut section) = (Vec::new(), Vec::new(), "");
    for l in toml.lines() {
        let t = l.trim();
        if t.starts_with('[') && !t.starts_with("[\"") {
            section = if t == "[package.metadata.deb]" {
                "deb"
            } else if t == "[package.metadata.generate-rpm]" {
                "rpm"
            } else {
                ""
            };
        }
        if section == "deb" && t.starts_with("[\"") {
            let q = quoted_strings(t);
            let (src, dest) = (&q[0], &q[1]);
            let file = src.rsplit('/').next().unwrap_or(src);
            let path = if dest.ends_with('/') {
                format!("/{dest}{file}")
            } else {
                format!("/{dest}")
            };
            deb.push(path);
        }
        if section == "rpm" && t.starts_with("{ source") {
            let field = |k: &str| {
                t.split(&format!("{k} = \""))
                    .nth(1)
                    .and_then(|d| d.split('"').next())
                    .map(str::to_owned)
                    .expect("an rpm asset's field")
            };
            let (src, dest) = (field("source"), field("dest"));
            let file = src.rsplit('/').next().unwrap_or(&src).to_owned();
            rpm.push(if dest.ends_with('/') {
                format!("{dest}{file}")
            } else {
                dest
            });
        }
    }
    let mut scripts = Vec::new();
    for f in [
        "packaging/hook-install.sh",
        "packaging/debian/postinst",
        "packaging/rpm/post.sh",
    ] {
        let text = std::fs::read_to_string(root.join(f)).expect("maintainer script");
        // The hook's paths are written once for every driver (`hooks/$1`, `hooks/$d.d/…`
        // over `GPUHOOK_DRIVERS="lxc qemu"`): each driver's own path is made.
        let drivers: Vec<&str> = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("GPUHOOK_DRIVERS="))
            .map(|v| v.trim_matches('"').split_whitespace().collect())
            .unwrap_or_default();
        for w in text.split(|c: char| c.is_whitespace() || "\"'=;()".contains(c)) {
            if w.starts_with("/etc/libvirt/hooks/") || w.starts_with("/usr/bin/gpuhook") {
                match ["$1", "$d"].into_iter().find(|v| w.contains(v)) {
                    Some(v) => scripts.extend(drivers.iter().map(|d| w.replace(v, d))),
                    None => scripts.push(w.to_owned()),
                }
            }
        }
    }
    Installed { deb, rpm, scripts }
}

/// Whether the docs' `path` is the file installed at `asset`: `/lib/systemd/system/X` (the
/// `.deb`'s) and `/usr/lib/systemd/system/X` (the `.rpm`'s) are one file to the docs, and an
/// asset's glob (`docs/*.md`) covers each name it matches (a glob in the docs only itself).
fn same_file(asset: &str, path: &str) -> bool {
    let n = |p: &str| {
        p.strip_prefix("/usr")
            .filter(|r| r.starts_with("/lib/systemd/"))
            .map(str::to_owned)
            .unwrap_or_else(|| p.to_owned())
    };
    let (a, p) = (n(asset), n(path));
    a == p || (!p.contains('*') && glob(&a, &p))
}

/// `pattern` with `*` (within one path component) matching `path`.
fn glob(pattern: &str, path: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == path,
        Some((pre, post)) => {
            path.starts_with(pre)
                && path.len() >= pre.len() + post.len()
                && path.ends_with(post)
                && !path[pre.len()..path.len() - post.len()].contains('/')
        }
    }
}

/// Whether a table's path `listed` names the asset installed at `asset` (a glob over names, the
/// `.deb`'s and `.rpm`'s unit directories one).
pub fn installed_as(listed: &str, asset: &str) -> bool {
    same_file(asset, listed)
}

impl Installed {
    pub fn in_deb(&self, p: &str) -> bool {
        self.deb.iter().any(|d| same_file(d, p))
    }
    pub fn in_rpm(&self, p: &str) -> bool {
        self.rpm.iter().any(|d| same_file(d, p))
    }
    pub fn by_script(&self, p: &str) -> bool {
        self.scripts.iter().any(|s| s == p)
    }
    /// A path (or a directory, ending in `/`) something installs.
    pub fn has(&self, p: &str) -> bool {
        let under = |d: &String| p.ends_with('/') && same_file(&d[..d.len().min(p.len())], p);
        // `under`: a directory the docs name, some asset below it.
        self.in_deb(p)
            || self.in_rpm(p)
            || self.by_script(p)
            || self
                .deb
                .iter()
                .chain(&self.rpm)
                .chain(&self.scripts)
                .any(under)
    }
    /// A file name (`gpuhook-health.timer`, `gpuhook-runtime.1.gz`) some installed file has.
    pub fn has_name(&self, name: &str) -> bool {
        self.deb
            .iter()
            .chain(&self.rpm)
            .any(|d| d.rsplit('/').next() == Some(name))
    }
}

/// The paths a doc says the packages install: under gpuhook's install prefixes.
pub fn install_paths(doc: &Doc) -> Vec<(usize, String)> {
    const PREFIXES: [&str; 11] = [
        "/usr/bin/gpuhook",
        "/usr/share/gpuhook/",
        "/usr/share/doc/gpuhook/",
        "/usr/share/man/",
        "/usr/lib/systemd/system/",
        "/lib/systemd/system/",
        "/usr/lib/tmpfiles.d/",
        "/usr/share/bash-completion/",
        "/usr/share/zsh/",
        "/usr/share/fish/",
        "/etc/libvirt/hooks/",
    ];
    let mut texts: Vec<(usize, String)> =
        doc.spans.iter().map(|s| (s.line, s.text.clone())).collect();
    for b in &doc.blocks {
        texts.extend(
            b.lines
                .iter()
                .enumerate()
                .map(|(i, l)| (b.line_of(i), l.clone())),
        );
    }
    let mut v = Vec::new();
    for (n, t) in texts {
        for w in t.split(|c: char| c.is_whitespace() || "\"'`(),;:[]{}=<>".contains(c)) {
            let w = w.trim_end_matches(['.', '…']);
            if PREFIXES.iter().any(|p| w.starts_with(p)) && !w.contains('…') {
                v.push((n, w.to_owned()));
            }
        }
    }
    v
}

/// Unit files and manual pages a doc names (`gpuhook-health.timer`, `gpuhook-runtime(1)`), as
/// installed file names.
pub fn named_units_and_pages(doc: &Doc) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for (n, line) in &doc.prose {
        for w in line.split(|c: char| !(c.is_ascii_alphanumeric() || "-.()".contains(c))) {
            let w = w.trim_end_matches('.');
            let unit =
                w.starts_with("gpuhook-") && (w.ends_with(".service") || w.ends_with(".timer"));
            if unit {
                v.push((*n, w.to_owned()));
            }
            if let Some(page) = w.strip_suffix("(1)").filter(|p| p.starts_with("gpuhook")) {
                v.push((*n, format!("{page}.1.gz")));
            }
        }
    }
    v
}

/// The rows of a files table (`doc-test files`): each installed path the first cell names
/// (a name after a full path is in that path's directory), and the packages the row names.
pub fn files_table(lines: &[String]) -> Vec<(usize, Vec<String>, BTreeSet<String>)> {
    let mut rows = Vec::new();
    for (i, l) in lines.iter().enumerate().skip(2) {
        let cells: Vec<&str> = l.split('|').collect();
        if cells.len() < 4 {
            continue;
        }
        let (mut paths, mut dir) = (Vec::new(), String::new());
        for (k, span) in cells[1].split('`').enumerate() {
            if k % 2 == 0 || span.is_empty() {
                continue;
            }
            let p = if span.starts_with('/') {
                span.to_owned()
            } else {
                format!("{dir}{span}")
            };
            dir = p[..=p.rfind('/').unwrap_or(0)].to_owned();
            paths.push(p);
        }
        let last = cells
            .iter()
            .rev()
            .find(|c| !c.trim().is_empty())
            .copied()
            .unwrap_or("");
        let pkgs = words(last)
            .into_iter()
            .map(|w| {
                w.trim_matches(|c: char| !(c.is_alphanumeric() || c == '.'))
                    .to_owned()
            })
            .filter(|w| w == ".deb" || w == ".rpm")
            .collect();
        rows.push((i, paths, pkgs));
    }
    rows
}

// ---- links ----

/// A relative link's target that does not exist, or whose `#anchor` no heading there makes.
pub fn bad_link(root: &Path, doc: &Doc, target: &str, docs: &[Doc]) -> Option<String> {
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let dir = Path::new(&doc.path).parent().unwrap_or(Path::new(""));
    let rel = if file.is_empty() {
        Path::new(&doc.path).to_path_buf()
    } else {
        dir.join(file)
    };
    let norm = normalize(&rel);
    if !root.join(&norm).exists() {
        return Some(format!("link to {target}: {norm} does not exist"));
    }
    let anchor = anchor?;
    let target_doc = docs
        .iter()
        .find(|d| Path::new(&d.path) == Path::new(&norm))?;
    (!target_doc.anchors.iter().any(|a| a == anchor))
        .then(|| format!("link to {target}: {norm} has no heading whose anchor is #{anchor}"))
}

fn normalize(p: &Path) -> String {
    let mut v: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                v.pop();
            }
            std::path::Component::CurDir => {}
            c => v.push(c.as_os_str().to_string_lossy().into_owned()),
        }
    }
    v.join("/")
}

// ---- metrics ----

/// The metric families `gpuhook metrics` writes: the names in `src/openstack/metrics.rs`
/// (its code, not its tests).
pub fn metric_families(root: &Path) -> BTreeSet<String> {
    let src = std::fs::read_to_string(root.join("src/openstack/metrics.rs")).expect("metrics.rs");
    let code = src.split("#[cfg(test)]").next().unwrap_or(&src);
    // Each string literal that is a name alone: `"gpuhook_gpu_info"`.
    code.match_indices("\"gpuhook_")
        .filter_map(|(i, _)| {
            let rest = &code[i + 1..];
            let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c == '_'))?;
            rest[end..].starts_with('"').then(|| rest[..end].to_owned())
        })
        .collect()
}

/// The `gpuhook_…` metric names a text names, with their lines.
pub fn metric_names(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for w in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if w.starts_with("gpuhook_") && w.len() > "gpuhook_".len() {
                v.push((n + 1, w.to_owned()));
            }
        }
    }
    v
}

// ---- the request's annotation keys ----

/// The request's keys, as `gpuhook.io/KEY` annotations.
pub fn request_keys() -> Vec<String> {
    gpuhook::request::oci::KEYS
        .split(", ")
        .map(|k| format!("gpuhook.io/{k}"))
        .collect()
}

/// Every `gpuhook.io/…` a text names, with its line.
pub fn annotations(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(p) = rest.find("gpuhook.io/") {
            let after = &rest[p + "gpuhook.io/".len()..];
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '*' || c == '…'))
                .unwrap_or(after.len());
            v.push((n + 1, format!("gpuhook.io/{}", &after[..end])));
            rest = &after[end..];
        }
    }
    v
}

#[test]
fn reads_keys_assets_and_tables() {
    assert!(config_keys().contains(&"reset_on_release".to_string()));
    assert!(load(r#""sharing": {"0000:07:00.0": {"replicas": 3}}"#).is_ok());
    assert!(load(r#""reset_cmd": "pci""#)
        .unwrap_err()
        .contains("unknown field `reset_cmd`"));
    assert!(same_file(
        "/lib/systemd/system/gpuhook-health.timer",
        "/usr/lib/systemd/system/gpuhook-health.timer"
    ));
    assert!(glob(
        "/usr/share/doc/gpuhook/guides/*.md",
        "/usr/share/doc/gpuhook/guides/health.md"
    ));
    let rows = files_table(&[
        "| file | what | in |".into(),
        "|---|---|---|".into(),
        "| `/usr/share/man/man1/gpuhook.1.gz`, `gpuhook-runtime.1.gz` | man | `.deb`, `.rpm` |"
            .into(),
    ]);
    assert_eq!(
        rows[0].1,
        [
            "/usr/share/man/man1/gpuhook.1.gz",
            "/usr/share/man/man1/gpuhook-runtime.1.gz"
        ]
    );
    assert_eq!(rows[0].2.len(), 2);
    assert_eq!(
        annotations("a `gpuhook.io/gpus: \"1\"` and gpuhook.io/*"),
        [(1, "gpuhook.io/gpus".into()), (1, "gpuhook.io/*".into())]
    );
}
