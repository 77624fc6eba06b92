//! A small Rust lexer for the structure check: comments become spaces, the insides of string
//! and char literals become `x`, `#[cfg(test)]` items become spaces. Newlines are kept, so a
//! byte offset's line number is the same in the original and in the result.

/// `src` with comments blanked (spaces) and literal contents replaced by `x`.
pub fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize, fill: u8| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = fill;
            }
        }
    };
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = b[i..]
                .iter()
                .position(|&x| x == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end, b' ');
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let j = j.min(b.len());
            blank(&mut out, i, j, b' ');
            i = j;
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r')))
            && !prev_is_ident(b, i)
            && raw_start(b, i + if c == b'b' { 2 } else { 1 }).is_some()
        {
            let (hashes, open) = raw_start(b, i + if c == b'b' { 2 } else { 1 }).unwrap_or((0, i));
            let mut j = open + 1;
            let end = loop {
                if j >= b.len() {
                    break b.len();
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                    && b.len() >= j + 1 + hashes
                {
                    break j;
                }
                j += 1;
            };
            blank(&mut out, open + 1, end, b'x');
            i = (end + 1 + hashes).min(b.len());
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let j = j.min(b.len());
            blank(&mut out, i + 1, j, b'x');
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 3;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                blank(&mut out, i + 1, j.min(b.len()), b'x');
                i = j + 1;
            } else {
                let ch_len = src[i + 1..].chars().next().map_or(0, char::len_utf8);
                if b.get(i + 1 + ch_len) == Some(&b'\'') {
                    blank(&mut out, i + 1, i + 1 + ch_len, b'x');
                    i += 2 + ch_len;
                } else {
                    i += 1;
                }
            }
        } else {
            i += 1;
        }
    }
    // Multi-byte characters inside blanked spans became several ASCII bytes: still valid UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

fn raw_start(b: &[u8], mut i: usize) -> Option<(usize, usize)> {
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    (b.get(i) == Some(&b'"')).then_some((hashes, i))
}

pub fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn prev_is_ident(b: &[u8], i: usize) -> bool {
    i > 0 && is_ident(b[i - 1])
}

/// Offsets where `word` occurs as a whole identifier in `code`.
pub fn find_word(code: &str, word: &str) -> Vec<usize> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find(word) {
        let at = from + p;
        let end = at + word.len();
        if !prev_is_ident(b, at) && b.get(end).is_none_or(|&c| !is_ident(c)) {
            v.push(at);
        }
        from = at + 1;
    }
    v
}

/// The offset just past the brace that closes the one at `open`.
pub fn matching(code: &[u8], open: usize, (l, r): (u8, u8)) -> usize {
    let mut depth = 0usize;
    for (j, &c) in code.iter().enumerate().skip(open) {
        if c == l {
            depth += 1;
        } else if c == r {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
    }
    code.len()
}

/// From `from`, the first `{` or `;` outside parentheses and brackets.
pub fn item_body(code: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut depth = 0i32;
    for (j, &c) in code.iter().enumerate().skip(from) {
        match c {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'{' | b';' if depth <= 0 => return Some((j, c)),
            _ => {}
        }
    }
    None
}

/// The stripped code with every `#[cfg(test)]` item blanked, and the names of test modules
/// declared with `#[cfg(test)] mod name;` (their files are test files). `None` when the whole
/// file is test code (`#![cfg(test)]`).
pub fn without_tests(code: &str) -> Option<(String, Vec<String>)> {
    let mut out = code.as_bytes().to_vec();
    let mut test_mods = Vec::new();
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(p) = code[from..].find("#") {
        let at = from + p;
        from = at + 1;
        let inner = b.get(at + 1) == Some(&b'!');
        let open = at + 1 + usize::from(inner);
        if b.get(open) != Some(&b'[') {
            continue;
        }
        let close = matching(b, open, (b'[', b']'));
        let attr: String = code[open..close]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let is_test = attr.starts_with("[cfg(")
            && !attr.contains("not(")
            && find_word(&attr, "test").len() == 1;
        if !is_test {
            continue;
        }
        if inner {
            return None;
        }
        let Some((end_at, kind)) = item_body(b, close) else {
            continue;
        };
        let end = if kind == b'{' {
            matching(b, end_at, (b'{', b'}'))
        } else {
            end_at + 1
        };
        let words: Vec<&str> = code[close..end_at].split_whitespace().collect();
        if kind == b';' {
            if let Some(i) = words.iter().position(|w| *w == "mod") {
                if let Some(n) = words.get(i + 1) {
                    test_mods.push(n.trim_end_matches(';').to_owned());
                }
            }
        }
        for c in &mut out[at..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    Some((String::from_utf8(out).unwrap_or_default(), test_mods))
}

/// 1-based line of a byte offset.
pub fn line_of(code: &str, at: usize) -> usize {
    code.as_bytes()[..at.min(code.len())]
        .iter()
        .filter(|&&c| c == b'\n')
        .count()
        + 1
}

/// Lines holding code (not blank once comments and test items are gone).
pub fn code_lines(code: &str) -> usize {
    code.lines().filter(|l| !l.trim().is_empty()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_strings_are_blanked() {
        let s = strip("let a = \"crate::x\"; // crate::y\n/* crate::z /* n */ */ crate::w");
        assert!(!s.contains("crate::x") && !s.contains("crate::y") && !s.contains("crate::z"));
        assert!(s.contains("crate::w"));
        assert_eq!(s.lines().count(), 2);
        let r = strip("r#\"a \" crate::q\"# crate::k 'a' '\\n' &'a str");
        assert!(!r.contains("crate::q") && r.contains("crate::k") && r.contains("&'a str"));
        let q = strip("let c = '\\''; let d = b'\"'; let e = b\"crate::s\"; crate::t");
        assert!(!q.contains("crate::s") && q.contains("crate::t"), "{q}");
    }

    #[test]
    fn test_items_are_blanked() {
        let (c, mods) =
            without_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n fn b() { unsafe {} }\n}\n#[cfg(test)]\nmod fake;\nfn c() {}")
                .unwrap();
        assert!(
            c.contains("fn a")
                && c.contains("fn c")
                && !c.contains("unsafe")
                && !c.contains("fake")
        );
        assert_eq!(mods, ["fake"]);
        assert!(without_tests("#![cfg(test)]\nfn a() {}").is_none());
        let (k, _) = without_tests("#[cfg(not(test))]\nfn keep() {}").unwrap();
        assert!(k.contains("keep"));
    }

    #[test]
    fn words() {
        assert_eq!(
            find_word("unsafe x unsafe_op myunsafe unsafe", "unsafe"),
            [0, 28]
        );
    }
}
