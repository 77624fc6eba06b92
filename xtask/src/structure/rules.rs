//! The rules, each over the lexed files or their file-level edges.

use super::lex::{self, find_word, is_ident, item_body, line_of, matching};
use super::{Finding, SrcFile};
use std::collections::{BTreeMap, BTreeSet};

pub const MAX_FILE_LINES: usize = 700;
pub const MAX_FN_LINES: usize = 100;

fn finding(kind: &'static str, text: String) -> Finding {
    Finding { kind, text }
}

/// Strongly connected components of more than one file.
pub fn circles(edges: &BTreeMap<(String, String), usize>) -> Vec<Finding> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for &m in next.get(n).map_or(&[][..], Vec::as_slice) {
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let nodes: BTreeSet<&str> = next.keys().copied().collect();
    let reaches: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut v = Vec::new();
    for &n in &nodes {
        if done.contains(n) || !reaches[n].contains(n) {
            continue;
        }
        let comp: BTreeSet<&str> = reaches[n]
            .iter()
            .copied()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(n)))
            .collect();
        done.extend(comp.iter().copied());
        let inside: Vec<String> = edges
            .iter()
            .filter(|((a, b), _)| comp.contains(a.as_str()) && comp.contains(b.as_str()))
            .map(|((a, b), line)| format!("{a}:{line} -> {b}"))
            .collect();
        let names: Vec<&str> = comp.into_iter().collect();
        v.push(finding(
            "circles",
            format!("{} ({})", names.join(" <-> "), inside.join("; ")),
        ));
    }
    v
}

/// The room a file is in, lowest first; `None` for the crate roots.
pub fn room(rel: &str) -> Option<(usize, &str)> {
    const ROOMS: [&str; 8] = [
        "request",
        "host",
        "cgroup",
        "cdi",
        "enter",
        "reserve",
        "openstack",
        "doors",
    ];
    let inner = rel.strip_prefix("src/")?;
    match inner.split_once('/') {
        Some((dir, _)) => ROOMS.iter().position(|r| *r == dir).map(|i| (i + 1, dir)),
        None if inner == "lib.rs" || inner == "main.rs" => None,
        None => Some((0, "base")),
    }
}

/// Imports that go up the rooms (doors > openstack > reserve > enter > cdi > cgroup > host >
/// request > base files).
pub fn rooms(edges: &BTreeMap<(String, String), usize>) -> Vec<Finding> {
    let mut v = Vec::new();
    for ((a, b), line) in edges {
        let (Some((ra, na)), Some((rb, nb))) = (room(a), room(b)) else {
            continue;
        };
        if rb > ra {
            v.push(finding(
                "rooms",
                format!("{a}:{line}: imports {b} ({na} is below {nb})"),
            ));
        }
    }
    v
}

fn next_ident(code: &str, from: usize) -> Option<(usize, String)> {
    let rest = &code[from..];
    let skip = rest.len() - rest.trim_start().len();
    let name: String = rest[skip..]
        .bytes()
        .take_while(|&c| is_ident(c))
        .map(char::from)
        .collect();
    (!name.is_empty()).then_some((from + skip, name))
}

/// Functions: (name, `fn` offset, lines from `fn` to its closing brace).
pub fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    for at in find_word(code, "fn") {
        let Some((_, name)) = next_ident(code, at + 2) else {
            continue;
        };
        if let Some((open, b'{')) = item_body(b, at) {
            let end = matching(b, open, (b'{', b'}'));
            v.push((
                name,
                at,
                line_of(code, end.saturating_sub(1)) - line_of(code, at) + 1,
            ));
        }
    }
    v
}

fn in_dirs(rel: &str, dirs: &[&str]) -> bool {
    dirs.iter().any(|d| rel.starts_with(d))
}

/// Sizes, `unsafe`, config loading, hand-built holders and string error fields in one file.
pub fn per_file(f: &SrcFile) -> Vec<Finding> {
    let (rel, code) = (f.rel.as_str(), f.code.as_str());
    let mut v = Vec::new();
    let n = lex::code_lines(code);
    if n > MAX_FILE_LINES {
        v.push(finding(
            "size",
            format!("{rel}: {n} lines of code (over {MAX_FILE_LINES})"),
        ));
    }
    for (name, at, lines) in functions(code) {
        if lines > MAX_FN_LINES {
            let line = line_of(code, at);
            v.push(finding(
                "size",
                format!("{rel}:{line}: fn {name} is {lines} lines (over {MAX_FN_LINES})"),
            ));
        }
    }
    if !in_dirs(rel, &["src/enter/", "src/host/", "src/cgroup/"]) {
        let lines: BTreeSet<usize> = find_word(code, "unsafe")
            .into_iter()
            .map(|at| line_of(code, at))
            .collect();
        for line in lines {
            v.push(finding(
                "unsafe",
                format!("{rel}:{line}: unsafe outside enter/, host/, cgroup/"),
            ));
        }
    }
    if !in_dirs(rel, &["src/doors/", "src/host/config.rs"]) {
        for at in find_word(code, "Config") {
            let rest = &code[at + "Config".len()..];
            if rest.starts_with("::load") {
                let call: String = rest[2..]
                    .bytes()
                    .take_while(|&c| is_ident(c))
                    .map(char::from)
                    .collect();
                let line = line_of(code, at);
                v.push(finding(
                    "config",
                    format!("{rel}:{line}: Config::{call} outside doors/"),
                ));
            }
        }
    }
    if rel != "src/reserve/lifecycle/holder.rs" {
        v.extend(holders(rel, code));
    }
    v.extend(string_errors(rel, code));
    v
}

fn holders(rel: &str, code: &str) -> Vec<Finding> {
    let mut v = Vec::new();
    for at in find_word(code, "Holder") {
        if !code[at + "Holder".len()..].trim_start().starts_with('{') {
            continue;
        }
        let before = code[..at].trim_end();
        let prev: String = before
            .bytes()
            .rev()
            .take_while(|&c| is_ident(c))
            .map(char::from)
            .collect();
        let prev: String = prev.chars().rev().collect();
        let line_start = code[..at].rfind('\n').map_or(0, |p| p + 1);
        let line_text = code[line_start..at].trim_start();
        if before.ends_with("->")
            || ["struct", "enum", "impl", "for", "union", "trait", "mod"].contains(&prev.as_str())
            || line_text.starts_with("impl")
        {
            continue;
        }
        let line = line_of(code, at);
        v.push(finding(
            "holders",
            format!("{rel}:{line}: Holder built outside reserve/lifecycle/holder.rs"),
        ));
    }
    v
}

/// Structs and enums: (keyword offset, name, body), the body `None` for a unit or tuple struct.
fn type_items(code: &str) -> Vec<(usize, String, Option<&str>)> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    for kw in ["struct", "enum"] {
        for at in find_word(code, kw) {
            let Some((_, name)) = next_ident(code, at + kw.len()) else {
                continue;
            };
            let body = match item_body(b, at) {
                Some((open, b'{')) => Some(&code[open..matching(b, open, (b'{', b'}'))]),
                _ => None,
            };
            v.push((at, name, body));
        }
    }
    v
}

fn string_errors(rel: &str, code: &str) -> Vec<Finding> {
    let mut v = Vec::new();
    for (at, name, body) in type_items(code) {
        let Some(body) = body else { continue };
        let attrs_from = code[..at].rfind([';', '}']).map_or(0, |p| p + 1);
        let is_error = name.ends_with("Error")
            || code[attrs_from..at].contains("Error")
            || body.contains("#[error");
        if !is_error {
            continue;
        }
        for field in ["msg", "message", "detail"] {
            for f_at in find_word(body, field) {
                let rest = body[f_at + field.len()..].trim_start();
                if rest.starts_with(':')
                    && !rest.starts_with("::")
                    && rest[1..].trim_start().starts_with("String")
                {
                    let line = line_of(code, at) + line_of(body, f_at) - 1;
                    v.push(finding(
                        "errors",
                        format!("{rel}:{line}: {name} has a String field `{field}`"),
                    ));
                }
            }
        }
    }
    v
}

/// Brace depth at `at`, less the inline modules around it: 0 at item level.
fn item_level(f: &SrcFile, at: usize) -> bool {
    let depth = f.code[..at].bytes().fold(0i64, |d, c| match c {
        b'{' => d + 1,
        b'}' => d - 1,
        _ => d,
    });
    let mods = f
        .inline
        .iter()
        .filter(|(o, e, _)| *o < at && at < *e)
        .count();
    depth == mods as i64
}

/// Type names (struct, enum, trait, union, type alias) defined more than once under src/.
pub fn dupes(files: &[SrcFile]) -> Vec<Finding> {
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.test) {
        let code = f.code.as_str();
        for kw in ["struct", "enum", "trait", "union", "type"] {
            for at in find_word(code, kw) {
                let Some((_, name)) = next_ident(code, at + kw.len()) else {
                    continue;
                };
                if !name.starts_with(|c: char| c.is_ascii_uppercase())
                    || (kw == "type" && !item_level(f, at))
                {
                    continue;
                }
                names
                    .entry(name)
                    .or_default()
                    .push(format!("{}:{}", f.rel, line_of(code, at)));
            }
        }
    }
    names
        .into_iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(name, at)| {
            finding(
                "dupes",
                format!("{name} is defined {} times: {}", at.len(), at.join(", ")),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rel: &str, src: &str) -> SrcFile {
        let (code, _) = lex::without_tests(&lex::strip(src)).unwrap();
        let inline = super::super::inline_mods(&code);
        SrcFile {
            rel: rel.into(),
            module: super::super::module_of(rel),
            code,
            test: false,
            inline,
        }
    }

    fn edges(list: &[(&str, &str)]) -> BTreeMap<(String, String), usize> {
        list.iter()
            .map(|(a, b)| ((a.to_string(), b.to_string()), 1))
            .collect()
    }

    #[test]
    fn circles_are_components() {
        let e = edges(&[
            ("src/a.rs", "src/b.rs"),
            ("src/b.rs", "src/c.rs"),
            ("src/c.rs", "src/a.rs"),
            ("src/c.rs", "src/d.rs"),
        ]);
        let c = circles(&e);
        assert_eq!(c.len(), 1);
        assert!(
            c[0].text
                .starts_with("src/a.rs <-> src/b.rs <-> src/c.rs ("),
            "{}",
            c[0].text
        );
        assert!(circles(&edges(&[("src/a.rs", "src/b.rs")])).is_empty());
    }

    #[test]
    fn rooms_go_down() {
        let e = edges(&[
            ("src/reserve/a.rs", "src/doors/hook.rs"),
            ("src/doors/hook.rs", "src/reserve/a.rs"),
            ("src/log.rs", "src/host/x.rs"),
            ("src/main.rs", "src/doors/cli.rs"),
        ]);
        let r = rooms(&e);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].text.contains("log.rs") && r[1].text.contains("reserve is below doors"));
    }

    #[test]
    fn per_file_rules() {
        let f = file(
            "src/reserve/x.rs",
            "#[derive(Debug, thiserror::Error)]\npub enum BadError {\n    #[error(\"{msg}\")]\n    Config { msg: String },\n}\n\
             fn a() { let c = Config::load(); unsafe { f() } }\n\
             fn h() -> Holder { Holder { a: 1 } }\n\
             #[cfg(test)]\nmod tests { fn t() { unsafe {} Config::load(); } }\n",
        );
        let v: Vec<String> = per_file(&f).iter().map(ToString::to_string).collect();
        assert_eq!(
            v,
            [
                "unsafe: src/reserve/x.rs:6: unsafe outside enter/, host/, cgroup/",
                "config: src/reserve/x.rs:6: Config::load outside doors/",
                "holders: src/reserve/x.rs:7: Holder built outside reserve/lifecycle/holder.rs",
                "errors: src/reserve/x.rs:4: BadError has a String field `msg`",
            ]
        );
        assert!(per_file(&file("src/host/y.rs", "fn a() { unsafe {} }")).is_empty());
    }

    #[test]
    fn long_functions() {
        let body = "    x();\n".repeat(101);
        let f = file(
            "src/a.rs",
            &format!("fn long() {{\n{body}}}\nfn short() {{}}\ntrait T {{ fn decl(); }}\n"),
        );
        let v = per_file(&f);
        assert_eq!(v.len(), 1);
        assert!(v[0].text.contains("fn long is 103 lines"), "{}", v[0].text);
    }

    #[test]
    fn duplicate_types() {
        let a = file("src/a.rs", "pub struct Host;\nimpl Tr for X { type Host = u8; }\npub mod m { pub type Seen = u8; }");
        let b = file(
            "src/b.rs",
            "enum Host { A }\nstruct Seen(u8);\ntrait Only {}",
        );
        let d = dupes(&[a, b]);
        let t: Vec<&str> = d.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(
            t,
            [
                "Host is defined 2 times: src/a.rs:1, src/b.rs:1",
                "Seen is defined 2 times: src/a.rs:3, src/b.rs:2"
            ]
        );
    }
}
