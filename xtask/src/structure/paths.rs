//! The module paths a file names: every `use` tree, expanded, and every inline
//! `crate::…`/`super::…`/`self::…` path. Input is code from `lex::strip`.

use super::lex::{find_word, is_ident};

/// A path named at byte offset `at`: its segments as written (`["super", "holder", "Holder"]`).
#[derive(Debug, PartialEq)]
pub struct Named {
    pub at: usize,
    pub segs: Vec<String>,
    /// From a `use` item (a bare first segment may then be a child module).
    pub from_use: bool,
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Star,
}

fn tokens(s: &str) -> Vec<Tok> {
    let b = s.as_bytes();
    let mut v = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_ident(c) || c == b'$' {
            let start = i;
            i += 1;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            v.push(Tok::Ident(s[start..i].trim_start_matches('$').to_owned()));
            continue;
        }
        match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                v.push(Tok::Colons);
                i += 1;
            }
            b'{' => v.push(Tok::Open),
            b'}' => v.push(Tok::Close),
            b',' => v.push(Tok::Comma),
            b'*' => v.push(Tok::Star),
            _ => {}
        }
        i += 1;
    }
    v
}

fn tree(t: &[Tok], pos: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while let Some(tok) = t.get(*pos) {
        *pos += 1;
        match tok {
            Tok::Colons => {}
            Tok::Ident(s) => {
                path.push(s.clone());
                if t.get(*pos) == Some(&Tok::Colons) {
                    continue;
                }
                if t.get(*pos) == Some(&Tok::Ident("as".into())) {
                    *pos += 2;
                }
                out.push(path);
                return;
            }
            Tok::Open => {
                while let Some(next) = t.get(*pos) {
                    match next {
                        Tok::Close => {
                            *pos += 1;
                            break;
                        }
                        Tok::Comma => *pos += 1,
                        _ => {
                            let before = *pos;
                            tree(t, pos, &path, out);
                            if *pos == before {
                                *pos += 1;
                            }
                        }
                    }
                }
                return;
            }
            Tok::Star => {
                out.push(path);
                return;
            }
            Tok::Close | Tok::Comma => {
                *pos -= 1;
                return;
            }
        }
    }
}

/// The paths of one `use` tree (`crate::a::{b, c::{self, D}}`), with `self` inside braces
/// dropped (`crate::a::c`).
pub fn expand_use(tree_text: &str) -> Vec<Vec<String>> {
    let t = tokens(tree_text);
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < t.len() {
        let before = pos;
        tree(&t, &mut pos, &[], &mut out);
        if pos == before {
            pos += 1;
        }
    }
    for p in &mut out {
        let first = p.first().cloned();
        p.retain(|s| s != "self");
        if first.as_deref() == Some("self") {
            p.insert(0, "self".into());
        }
    }
    out
}

/// Every path the code names.
pub fn named(code: &str) -> Vec<Named> {
    let b = code.as_bytes();
    let mut rest = b.to_vec();
    let mut v = Vec::new();
    for at in find_word(code, "use") {
        let Some(semi) = code[at..].find(';').map(|p| at + p) else {
            continue;
        };
        for segs in expand_use(&code[at + 3..semi]) {
            v.push(Named {
                at,
                segs,
                from_use: true,
            });
        }
        for c in &mut rest[at..semi] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    }
    let rest = String::from_utf8(rest).unwrap_or_default();
    let r = rest.as_bytes();
    for word in ["crate", "super", "self"] {
        for at in find_word(&rest, word) {
            if at >= 2 && &r[at - 2..at] == b"::" {
                continue;
            }
            let mut segs = vec![word.to_owned()];
            let mut i = at + word.len();
            while r.get(i..i + 2) == Some(b"::") && r.get(i + 2).is_some_and(|&c| is_ident(c)) {
                let start = i + 2;
                let mut j = start;
                while j < r.len() && is_ident(r[j]) {
                    j += 1;
                }
                segs.push(rest[start..j].to_owned());
                i = j;
            }
            if segs.len() > 1 {
                v.push(Named {
                    at,
                    segs,
                    from_use: false,
                });
            }
        }
    }
    v.sort_by_key(|n| n.at);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn use_trees_expand() {
        assert_eq!(
            expand_use(" crate::a::{b, c::{self, D as E}, f::*}"),
            [
                s(&["crate", "a", "b"]),
                s(&["crate", "a", "c"]),
                s(&["crate", "a", "c", "D"]),
                s(&["crate", "a", "f"])
            ]
        );
        assert_eq!(
            expand_use(" super::holder::Holder"),
            [s(&["super", "holder", "Holder"])]
        );
        assert_eq!(expand_use(" self::x::Y"), [s(&["self", "x", "Y"])]);
        assert_eq!(expand_use(" std::io"), [s(&["std", "io"])]);
        assert_eq!(
            expand_use(" {a::b, crate::c}"),
            [s(&["a", "b"]), s(&["crate", "c"])]
        );
    }

    #[test]
    fn inline_paths() {
        let code = "pub use crate::x::Y;\nfn f() { let a = crate::reserve::state::State::load(); super::super::g(); self.x; Self::new(); }";
        let n = named(code);
        let segs: Vec<_> = n.iter().map(|n| n.segs.join("::")).collect();
        assert_eq!(
            segs,
            [
                "crate::x::Y",
                "crate::reserve::state::State::load",
                "super::super::g"
            ]
        );
        assert!(n[0].from_use && !n[1].from_use);
    }
}
