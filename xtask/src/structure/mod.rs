//! `cargo run -p xtask -- structure`: the structural rules of docs/ARCHITECTURE.md, checked from
//! the code. One line per finding, `KIND: …`; see `KINDS`.

pub mod docs;
pub mod lex;
pub mod paths;
mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every kind of finding, in report order.
pub const KINDS: &[&str] = &[
    "circles", "rooms", "size", "unsafe", "config", "holders", "dupes", "errors", "docs",
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub kind: &'static str,
    pub text: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.text)
    }
}

/// One file under src/, lexed.
pub struct SrcFile {
    /// Relative to the repository root: `src/reserve/alloc.rs`.
    pub rel: String,
    /// Its module path: `["reserve", "alloc"]`; `[]` for lib.rs and main.rs.
    pub module: Vec<String>,
    /// Comments blanked, literals filled, `#[cfg(test)]` items blanked.
    pub code: String,
    /// tests.rs, a file below a `tests/` folder, or declared by `#[cfg(test)] mod x;`.
    pub test: bool,
    /// Inline modules `mod name { … }`: (open brace, end, name).
    pub inline: Vec<(usize, usize, String)>,
}

fn module_of(rel: &str) -> Vec<String> {
    let inner = rel.trim_start_matches("src/").trim_end_matches(".rs");
    if inner == "lib" || inner == "main" {
        return Vec::new();
    }
    let mut m: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    Ok(())
}

fn inline_mods(code: &str) -> Vec<(usize, usize, String)> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    for at in lex::find_word(code, "mod") {
        let rest = code[at + 3..].trim_start();
        let name: String = rest
            .bytes()
            .take_while(|&c| lex::is_ident(c))
            .map(char::from)
            .collect();
        if name.is_empty() {
            continue;
        }
        if let Some((open, b'{')) = lex::item_body(b, at) {
            if code[at + 3..open].trim() == name {
                v.push((open, lex::matching(b, open, (b'{', b'}')), name));
            }
        }
    }
    v
}

/// Reads and lexes every .rs file under `root/src`.
pub fn load(root: &Path) -> std::io::Result<Vec<SrcFile>> {
    let mut paths = Vec::new();
    walk(&root.join("src"), &mut paths)?;
    paths.sort();
    let mut files = Vec::new();
    let mut test_mods: BTreeSet<Vec<String>> = BTreeSet::new();
    for p in paths {
        let rel = p
            .strip_prefix(root)
            .unwrap_or(&p)
            .to_string_lossy()
            .replace('\\', "/");
        let src = std::fs::read_to_string(&p)?;
        let stripped = lex::strip(&src);
        let module = module_of(&rel);
        let mut test = rel.ends_with("/tests.rs") || rel.contains("/tests/");
        let code = match lex::without_tests(&stripped) {
            Some((code, mods)) => {
                for m in mods {
                    let mut path = module.clone();
                    path.push(m);
                    test_mods.insert(path);
                }
                code
            }
            None => {
                test = true;
                String::new()
            }
        };
        let inline = inline_mods(&code);
        files.push(SrcFile {
            rel,
            module,
            code,
            test,
            inline,
        });
    }
    for f in &mut files {
        if test_mods.iter().any(|t| f.module.starts_with(t)) {
            f.test = true;
        }
    }
    Ok(files)
}

/// The files that exist, for module resolution.
pub struct Tree {
    pub files: BTreeSet<String>,
}

impl Tree {
    fn module_file(&self, dir: &str, seg: &str) -> Option<String> {
        [format!("{dir}/{seg}.rs"), format!("{dir}/{seg}/mod.rs")]
            .into_iter()
            .find(|c| self.files.contains(c))
    }

    /// The deepest module file an absolute module path names.
    pub fn resolve(&self, abs: &[String]) -> String {
        let mut cur = "src/lib.rs".to_owned();
        let mut dir = "src".to_owned();
        for seg in abs {
            match self.module_file(&dir, seg) {
                Some(f) => {
                    cur = f;
                    dir = format!("{dir}/{seg}");
                }
                None => break,
            }
        }
        cur
    }
}

/// A file's module at `at`, inline modules included.
fn module_at(f: &SrcFile, at: usize) -> Vec<String> {
    let mut m = f.module.clone();
    for (open, end, name) in &f.inline {
        if *open < at && at < *end {
            m.push(name.clone());
        }
    }
    m
}

/// The absolute module path of a named path, if it is one of the crate's.
pub fn absolute(tree: &Tree, f: &SrcFile, n: &paths::Named) -> Option<Vec<String>> {
    let mut cur = module_at(f, n.at);
    let segs = &n.segs;
    match segs[0].as_str() {
        "crate" => return Some(segs[1..].to_vec()),
        "self" => {}
        "super" => {
            let mut i = 0;
            while segs.get(i).is_some_and(|s| s == "super") {
                cur.pop()?;
                i += 1;
            }
            cur.extend(segs[i..].iter().cloned());
            return Some(cur);
        }
        first if n.from_use => {
            // 2018 paths: `use child::X` names a child module of the current one.
            let dir = format!("src/{}", cur.join("/"))
                .trim_end_matches('/')
                .to_owned();
            tree.module_file(&dir, first)?;
            cur.extend(segs.iter().cloned());
            return Some(cur);
        }
        _ => return None,
    }
    cur.extend(segs[1..].iter().cloned());
    Some(cur)
}

/// File-level edges: (from, to) → the first line naming it.
pub fn edges(files: &[SrcFile]) -> BTreeMap<(String, String), usize> {
    let tree = Tree {
        files: files.iter().map(|f| f.rel.clone()).collect(),
    };
    let mut e = BTreeMap::new();
    for f in files.iter().filter(|f| !f.test && f.rel != "src/main.rs") {
        for n in paths::named(&f.code) {
            let Some(abs) = absolute(&tree, f, &n) else {
                continue;
            };
            let to = tree.resolve(&abs);
            if to != f.rel {
                e.entry((f.rel.clone(), to))
                    .or_insert_with(|| lex::line_of(&f.code, n.at));
            }
        }
    }
    e
}

/// Every finding for the repository at `root`.
pub fn check(root: &Path) -> std::io::Result<Vec<Finding>> {
    let files = load(root)?;
    let edges = edges(&files);
    let mut v = rules::circles(&edges);
    v.extend(rules::rooms(&edges));
    for f in files.iter().filter(|f| !f.test) {
        v.extend(rules::per_file(f));
    }
    v.extend(rules::dupes(&files));
    v.extend(docs::check(root)?);
    v.sort_by_key(|f| (KINDS.iter().position(|k| *k == f.kind), f.text.clone()));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_of_files() {
        assert_eq!(module_of("src/lib.rs"), Vec::<String>::new());
        assert_eq!(module_of("src/reserve/mod.rs"), ["reserve"]);
        assert_eq!(
            module_of("src/reserve/lifecycle/holder.rs"),
            ["reserve", "lifecycle", "holder"]
        );
    }

    #[test]
    fn resolution_is_to_the_deepest_file() {
        let tree = Tree {
            files: [
                "src/lib.rs",
                "src/a/mod.rs",
                "src/a/b.rs",
                "src/c.rs",
                "src/c/d.rs",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        };
        let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        assert_eq!(tree.resolve(&p("a::b::Item")), "src/a/b.rs");
        assert_eq!(tree.resolve(&p("a::Item")), "src/a/mod.rs");
        assert_eq!(tree.resolve(&p("c::d::e::f")), "src/c/d.rs");
        assert_eq!(tree.resolve(&p("Top")), "src/lib.rs");
        let f = SrcFile {
            rel: "src/a/b.rs".into(),
            module: vec!["a".into(), "b".into()],
            code: String::new(),
            test: false,
            inline: vec![],
        };
        let named = |s: &str, from_use| paths::Named {
            at: 0,
            segs: p(s),
            from_use,
        };
        assert_eq!(
            absolute(&tree, &f, &named("super::X", false)),
            Some(p("a::X"))
        );
        assert_eq!(
            absolute(&tree, &f, &named("super::super::c::d", false)),
            Some(p("c::d"))
        );
        assert_eq!(absolute(&tree, &f, &named("std::io", true)), None);
    }

    #[test]
    fn a_small_tree() {
        let root = std::env::temp_dir().join(format!("xtask-structure-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let files = [
            ("src/lib.rs", "pub mod doors;\npub mod reserve;\npub mod log;\n"),
            ("src/log.rs", "pub fn f() {}\n"),
            ("src/doors/mod.rs", "pub mod hook;\n"),
            ("src/doors/hook.rs", "use crate::reserve::life::step;\nfn run() { step(); }\n"),
            ("src/reserve/mod.rs", "pub mod life;\npub use life::step;\npub struct Holder;\n"),
            (
                "src/reserve/life.rs",
                "use super::Holder;\npub fn step() { crate::doors::hook::x(); }\n#[cfg(test)]\nmod tests { use crate::log::f; }\n",
            ),
            ("src/reserve/tests.rs", "use crate::doors::hook;\n"),
            ("README.md", "[a](docs/missing.md) [b](src/log.rs)\n"),
            ("docs/ARCHITECTURE.md", "doors/ reserve/ `src/reserve/life.rs` `gone.rs`\n"),
        ];
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let v: Vec<String> = check(&root)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            v,
            [
                "circles: src/doors/hook.rs <-> src/reserve/life.rs <-> src/reserve/mod.rs \
                 (src/doors/hook.rs:1 -> src/reserve/life.rs; src/reserve/life.rs:2 -> src/doors/hook.rs; \
                 src/reserve/life.rs:1 -> src/reserve/mod.rs; src/reserve/mod.rs:2 -> src/reserve/life.rs)",
                "rooms: src/reserve/life.rs:2: imports src/doors/hook.rs (reserve is below doors)",
                "docs: README.md:1: link to docs/missing.md, which does not exist",
                "docs: docs/ARCHITECTURE.md:1: names gone.rs, which does not exist",
            ]
        );
    }
}
