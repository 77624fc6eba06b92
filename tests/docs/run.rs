//! Runs a block marked `<!-- doc-test fakehost=PROFILE … -->` on a fresh fake host and
//! compares what gpuhook prints with what the block quotes.
//!
//! - A block with `$ ` lines is a transcript: each command runs in turn (a `gpuhook` or
//!   `gpuhook-runtime` command as written; another program through its `as "…":` stand-in),
//!   and the lines under it are its output (standard output and error, in the order
//!   written). For a stand-in only the lines that quote gpuhook (from `gpuhook: ` on) count.
//! - A block without is quoted output: each of its lines that quotes gpuhook (from
//!   `gpuhook: ` on; every line when none does) must be among the lines the set-up printed,
//!   in order.
//!
//! In a quoted line `…` stands for any text, a line of `…` alone for any lines, and each
//! `any=TEXT` of the comment for any text where it appears (a time, a PID). Runs of spaces
//! count as one.

use super::bed::Bed;
use super::markdown::{Block, DocTest};

/// What a run did.
#[derive(Default)]
pub struct Count {
    pub setup: usize,
    pub commands: usize,
    pub lines: usize,
}

impl Count {
    pub fn add(&mut self, o: &Count) {
        self.setup += o.setup;
        self.commands += o.commands;
        self.lines += o.lines;
    }
}

/// Runs one block: what it did, or what it found wrong (each a line `doc:line: difference`).
pub fn run(doc: &str, b: &Block, t: &DocTest) -> Result<Count, Vec<String>> {
    let at = |line: usize, what: String| format!("{doc}:{line}: {what}");
    let profile = t.get("fakehost").expect("a run");
    let mut bed = Bed::new(profile, t.words.iter().any(|w| w == "verbose"))
        .map_err(|e| vec![at(t.line, e)])?;
    let any: Vec<String> = t.all("any").map(str::to_owned).collect();
    let mut standins: Vec<(String, Vec<(usize, String)>)> = Vec::new();
    let (mut printed, mut last_out) = (Vec::new(), Vec::new());
    for (n, l) in &t.setup {
        if let Some(rest) = l.strip_prefix("as ") {
            let w = super::markdown::words(rest);
            let cmd = w
                .first()
                .map(|c| c.trim_end_matches(':').to_owned())
                .unwrap_or_default();
            let verbs = rest.split_once(": ").map(|x| x.1).unwrap_or("");
            standins.push((
                cmd,
                verbs.split(" ; ").map(|v| (*n, v.to_owned())).collect(),
            ));
            continue;
        }
        let out = bed
            .verb(l)
            .map_err(|e| vec![at(*n, format!("set-up `{l}`: {e}"))])?;
        if std::env::var_os("DOCS_SHOW").is_some() {
            eprintln!("{doc}:{n}: {l}\n  {}", out.join("\n  "));
        }
        last_out = out.clone();
        printed.extend(out);
    }
    let transcript = b.lines.iter().any(|l| l.starts_with("$ "));
    let mut count = Count {
        setup: t.setup.len(),
        ..Count::default()
    };
    if t.words.iter().any(|w| w == "json") {
        // The block is JSON the last set-up step printed: its keys and values.
        count.lines = b.lines.len();
        let doc_json = serde_json::from_str(&b.lines.join("\n"))
            .map_err(|e| vec![at(b.line, format!("not JSON: {e}"))])?;
        let last = t.setup.last().map(|(_, l)| l.as_str()).unwrap_or_default();
        let real = serde_json::from_str(&last_out.join("\n")).map_err(|e| {
            vec![at(
                t.line,
                format!("`{last}` printed no JSON ({e}): {last_out:?}"),
            )]
        })?;
        return json_within(&doc_json, &real, &any, "")
            .map(|_| count)
            .map_err(|e| vec![at(b.line, e)]);
    }
    if !transcript {
        count.lines = compared(&b.lines);
        return quoted(&b.lines, &printed, &any)
            .map_err(|(i, e)| vec![at(b.line_of(i), e)])
            .map(|_| count);
    }
    let mut errs = Vec::new();
    let mut i = 0;
    while i < b.lines.len() {
        let Some(cmd) = b.lines[i].strip_prefix("$ ") else {
            errs.push(at(
                b.line_of(i),
                "a transcript's first line is not a `$ ` command".into(),
            ));
            break;
        };
        let start = i + 1;
        let mut end = start;
        while end < b.lines.len() && !b.lines[end].starts_with("$ ") {
            end += 1;
        }
        let expected = &b.lines[start..end];
        count.commands += 1;
        count.lines += expected.iter().filter(|l| l.trim() != "…").count();
        let r = match standins.iter().find(|(c, _)| c == cmd) {
            Some((_, verbs)) => standin(&mut bed, verbs, expected, &any).map_err(|e| (start, e)),
            None if runnable(cmd) => match bed.shell(cmd, "") {
                Ok((out, _)) => {
                    same(expected, &out, &any).map_err(|(k, e)| (start + k, format!("`{cmd}` {e}")))
                }
                Err(e) => Err((i, e)),
            },
            None => Err((
                i,
                format!("`{cmd}` cannot run here: give it a stand-in (`as \"{cmd}\": …`)"),
            )),
        };
        if let Err((k, e)) = r {
            errs.push(at(b.line_of(k.min(b.lines.len().saturating_sub(1))), e));
        }
        i = end;
    }
    if errs.is_empty() {
        Ok(count)
    } else {
        Err(errs)
    }
}

/// A stand-in's verbs in place of a command: the gpuhook lines it printed against those the
/// doc quotes under the command.
fn standin(
    bed: &mut Bed,
    verbs: &[(usize, String)],
    expected: &[String],
    any: &[String],
) -> Result<(), String> {
    let mut out = Vec::new();
    for (_, v) in verbs {
        out.extend(bed.verb(v).map_err(|e| format!("stand-in `{v}`: {e}"))?);
    }
    let out: Vec<String> = out.iter().filter_map(|l| from_gpuhook(l)).collect();
    let exp: Vec<String> = expected.iter().filter_map(|l| from_gpuhook(l)).collect();
    if exp.is_empty() {
        return Err("quotes no line of gpuhook's (`gpuhook: …`): nothing to compare".into());
    }
    quoted(&exp, &out, any).map_err(|(_, e)| e)
}

/// The doc's JSON within what gpuhook printed: each key it has, with the value it shows (a
/// string with `…` as [`matches`] reads it, a value in `any` anything); an array's elements
/// in order, a `"…"` element standing for the rest.
fn json_within(
    doc: &serde_json::Value,
    real: &serde_json::Value,
    any: &[String],
    at: &str,
) -> Result<(), String> {
    use serde_json::Value;
    match (doc, real) {
        (Value::Object(d), Value::Object(r)) => {
            for (k, v) in d {
                let path = format!("{at}.{k}");
                let got = r.get(k).ok_or(format!("gpuhook's JSON has no {path}"))?;
                json_within(v, got, any, &path)?;
            }
            Ok(())
        }
        (Value::Array(d), Value::Array(r)) => {
            for (i, v) in d.iter().enumerate() {
                if v.as_str() == Some("…") {
                    return Ok(());
                }
                let got = r.get(i).ok_or(format!("gpuhook's JSON has no {at}[{i}]"))?;
                json_within(v, got, any, &format!("{at}[{i}]"))?;
            }
            (d.len() == r.len()).then_some(()).ok_or(format!(
                "{at} has {} elements, the doc shows {}",
                r.len(),
                d.len()
            ))
        }
        (Value::String(d), got) if d.contains('…') || any.contains(d) => match got {
            Value::String(g) if matches(d, g, any) => Ok(()),
            _ if d == "…" || any.contains(d) => Ok(()),
            _ => Err(format!("{at} is {got}, the doc shows {doc}")),
        },
        (d, got) if any.contains(&d.to_string()) || d == got => Ok(()),
        (d, got) => Err(format!("{at} is {got}, the doc shows {d}")),
    }
}

/// How many lines of a quoted block are compared.
fn compared(block: &[String]) -> usize {
    let gpuhook = block.iter().filter(|l| l.contains("gpuhook: ")).count();
    if gpuhook > 0 {
        gpuhook
    } else {
        block
            .iter()
            .filter(|l| !l.trim().is_empty() && l.trim() != "…")
            .count()
    }
}

/// A command the harness runs as written: gpuhook's own programs.
fn runnable(cmd: &str) -> bool {
    let first = cmd.split_whitespace().next().unwrap_or("");
    matches!(first, "gpuhook" | "gpuhook-runtime")
}

/// The part of a line that quotes gpuhook: from `gpuhook: ` on.
fn from_gpuhook(l: &str) -> Option<String> {
    l.find("gpuhook: ").map(|p| l[p..].to_owned())
}

fn norm(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `actual` is what `expected` quotes: `…` and each `any` text stand for any text.
pub fn matches(expected: &str, actual: &str, any: &[String]) -> bool {
    let mut e = norm(expected);
    for a in any {
        e = e.replace(a.as_str(), "…");
    }
    let a = norm(actual);
    let pieces: Vec<&str> = e.split('…').collect();
    if pieces.len() == 1 {
        return e == a;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if !a.starts_with(first)
        || !a[first.len()..].ends_with(last)
        || a.len() < first.len() + last.len()
    {
        return false;
    }
    let mut rest = &a[first.len()..a.len() - last.len()];
    for p in &pieces[1..pieces.len() - 1] {
        match rest.find(p) {
            Some(k) => rest = &rest[k + p.len()..],
            None => return false,
        }
    }
    true
}

/// A command's output against the lines the doc quotes under it, line for line (a line of `…`
/// alone: any lines). Err: the quoted line's index and the difference.
fn same(expected: &[String], actual: &[String], any: &[String]) -> Result<(), (usize, String)> {
    fn go(e: &[String], a: &[String], any: &[String], k: usize) -> Result<(), (usize, String)> {
        match (e.first(), a.first()) {
            (None, None) => Ok(()),
            (Some(x), _) if x.trim() == "…" => {
                let mut last = Err((k, "printed nothing the doc's lines after `…` quote".into()));
                for skip in 0..=a.len() {
                    last = go(&e[1..], &a[skip..], any, k + 1);
                    if last.is_ok() {
                        return last;
                    }
                }
                last
            }
            (None, Some(y)) => Err((
                k.saturating_sub(1),
                format!("printed {y:?}, which the doc leaves out"),
            )),
            (Some(x), None) => Err((k, format!("printed nothing more where the doc has {x:?}"))),
            (Some(x), Some(y)) if matches(x, y, any) => go(&e[1..], &a[1..], any, k + 1),
            (Some(x), Some(y)) => Err((k, format!("printed {y:?} where the doc has {x:?}"))),
        }
    }
    go(expected, actual, any, 0)
}

/// Each line the doc quotes (from `gpuhook: ` on, when any line has that) among the printed
/// lines, in order. Err: the quoted line's index and what is missing.
fn quoted(block: &[String], printed: &[String], any: &[String]) -> Result<(), (usize, String)> {
    let gpuhook = block.iter().any(|l| l.contains("gpuhook: "));
    let mut from = 0;
    for (i, l) in block.iter().enumerate() {
        let want = match (gpuhook, from_gpuhook(l)) {
            (true, Some(w)) => w,
            (true, None) => continue,
            (false, _) if l.trim().is_empty() || l.trim() == "…" => continue,
            (false, _) => l.clone(),
        };
        let pool: Vec<String> = printed[from..]
            .iter()
            .map(|p| {
                if gpuhook {
                    from_gpuhook(p).unwrap_or_default()
                } else {
                    p.clone()
                }
            })
            .collect();
        match pool.iter().position(|p| matches(&want, p, any)) {
            Some(k) => from += k + 1,
            None => {
                let closest = pool
                    .iter()
                    .max_by_key(|p| common_prefix(&norm(p), &norm(&want)))
                    .map(|p| format!("; closest: {p:?}"))
                    .unwrap_or_else(|| "; it printed nothing".into());
                return Err((i, format!("gpuhook printed no line {want:?}{closest}")));
            }
        }
    }
    Ok(())
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

#[test]
fn quoted_lines_match_with_elisions() {
    let any = vec!["0.07".to_string()];
    assert!(matches("reset in 0.07 s: ok", "reset in  1.93 s: ok", &any));
    assert!(matches(
        "error: (… /etc/lxc gh-b) exit",
        "error: (a b /etc/lxc gh-b) exit",
        &[]
    ));
    assert!(!matches("only 1 of 2 is free", "only 1 of 2 are free", &[]));
    let lines = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(same(&lines(&["a", "…", "z"]), &lines(&["a", "b", "c", "z"]), &[]).is_ok());
    assert_eq!(
        same(&lines(&["a", "b"]), &lines(&["a", "c"]), &[])
            .unwrap_err()
            .0,
        1
    );
    assert!(quoted(
        &lines(&["x: gpuhook: a", "noise"]),
        &lines(&["gpuhook: b", "gpuhook: a"]),
        &[]
    )
    .is_ok());
    assert!(quoted(
        &lines(&["gpuhook: a", "gpuhook: b"]),
        &lines(&["gpuhook: b", "gpuhook: a"]),
        &[]
    )
    .is_err());
}
