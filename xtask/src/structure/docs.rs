//! The docs: the files and folders docs/ARCHITECTURE.md names, the source files the other
//! documents name by their path from the root, the README's length, relative links.

use super::Finding;
use std::path::{Path, PathBuf};

pub const MAX_README_LINES: usize = 400;

fn finding(text: String) -> Finding {
    Finding { kind: "docs", text }
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != "corpus" && !name.to_string_lossy().starts_with('.') {
                files_under(&p, ext, out);
            }
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The `.rs` file names a text mentions (`src/reserve/alloc.rs`, `alloc.rs`, `tests/oci.rs`).
pub fn rs_names(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for w in line.split(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c))) {
            let w = w.trim_start_matches("./").trim_end_matches('.');
            if w.ends_with(".rs") && w.len() > 3 && !w.contains("//") {
                v.push((i + 1, w.to_owned()));
            }
        }
    }
    v
}

/// Relative link targets of a Markdown text, outside fenced code: (line, target without #anchor).
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut targets = Vec::new();
        let mut rest = line;
        while let Some(p) = rest.find("](") {
            let after = &rest[p + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push(
                after[..end]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            );
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some((_, target)) = t.split_once("]: ") {
                targets.push(target.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
        for t in targets {
            let t = t.trim_start_matches('<').trim_end_matches('>');
            if t.is_empty() || t.starts_with('#') || t.contains("://") || t.starts_with("mailto:") {
                continue;
            }
            v.push((i + 1, t.split('#').next().unwrap_or(t).to_owned()));
        }
    }
    v
}

pub fn check(root: &Path) -> std::io::Result<Vec<Finding>> {
    let mut v = Vec::new();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
    let n = readme.lines().count();
    if n > MAX_README_LINES {
        v.push(finding(format!(
            "README.md: {n} lines (over {MAX_README_LINES})"
        )));
    }
    let mut rs = Vec::new();
    for d in [
        "src",
        "tests",
        "benches",
        "testbed",
        "xtask",
        "gpuhook-libvirt",
        "gpuhook-device-plugin",
        "kubelet-api",
        "fuzz",
    ] {
        files_under(&root.join(d), "rs", &mut rs);
    }
    let rs: Vec<String> = rs
        .iter()
        .map(|p| {
            p.strip_prefix(root)
                .unwrap_or(p)
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    let arch_path = root.join("docs/ARCHITECTURE.md");
    let arch = std::fs::read_to_string(&arch_path).unwrap_or_default();
    for (line, name) in rs_names(&arch) {
        let found = rs
            .iter()
            .any(|f| *f == name || f.ends_with(&format!("/{name}")));
        if !found {
            v.push(finding(format!(
                "docs/ARCHITECTURE.md:{line}: names {name}, which does not exist"
            )));
        }
    }
    let mut dirs = Vec::new();
    collect_dirs(&root.join("src"), &mut dirs);
    for d in dirs {
        let rel = d
            .strip_prefix(root.join("src"))
            .unwrap_or(&d)
            .to_string_lossy()
            .replace('\\', "/");
        let base = rel.rsplit('/').next().unwrap_or(&rel);
        if !arch.contains(&format!("{base}/")) {
            v.push(finding(format!(
                "docs/ARCHITECTURE.md: does not name the folder src/{rel}/"
            )));
        }
    }
    let mut mds = vec![root.join("README.md")];
    files_under(&root.join("docs"), "md", &mut mds);
    mds.sort();
    for md in mds {
        let text = std::fs::read_to_string(&md)?;
        let rel = md
            .strip_prefix(root)
            .unwrap_or(&md)
            .to_string_lossy()
            .replace('\\', "/");
        if rel != "docs/ARCHITECTURE.md" {
            let rooted = [
                "src/",
                "tests/",
                "testbed/",
                "benches/",
                "xtask/",
                "fuzz/",
                "gpuhook-device-plugin/",
                "kubelet-api/",
            ];
            for (line, name) in rs_names(&text) {
                if rooted.iter().any(|r| name.starts_with(r)) && !root.join(&name).exists() {
                    v.push(finding(format!(
                        "{rel}:{line}: names {name}, which does not exist"
                    )));
                }
            }
        }
        let dir = md.parent().unwrap_or(root);
        for (line, target) in links(&text) {
            if !dir.join(&target).exists() {
                v.push(finding(format!(
                    "{rel}:{line}: link to {target}, which does not exist"
                )));
            }
        }
    }
    Ok(v)
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut ds: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    ds.sort();
    for d in ds {
        out.push(d.clone());
        collect_dirs(&d, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rs_names_and_links() {
        assert_eq!(
            rs_names(
                "`src/reserve/alloc.rs` and host/inventory.rs, not https://x.org/a.rs\nmps.rs."
            ),
            [
                (1, "src/reserve/alloc.rs".into()),
                (1, "host/inventory.rs".into()),
                (2, "mps.rs".into())
            ]
        );
        let md = "[a](docs/guides/oci.md#podman) [b](https://x) [c](#top)\n```\n[d](no.md)\n```\n[e]: ../SECURITY.md\n";
        assert_eq!(
            links(md),
            [
                (1, "docs/guides/oci.md".into()),
                (5, "../SECURITY.md".into())
            ]
        );
    }
}
