//! What the docs harness reads of a Markdown file: its fenced blocks (with the `doc-test`
//! comment before one, if any), its code spans, its headings' anchors and its links, each with
//! the line it is on. A small reader of the subset of Markdown the docs use, not a renderer.

use std::path::{Path, PathBuf};

/// One document, its path relative to the repository's root.
pub struct Doc {
    pub path: String,
    pub blocks: Vec<Block>,
    pub spans: Vec<Span>,
    /// Each heading's anchor, as GitHub makes it.
    pub anchors: Vec<String>,
    /// Relative links: (line, target as written).
    pub links: Vec<(usize, String)>,
    /// The lines outside fenced blocks (code spans kept), for prose checks.
    pub prose: Vec<(usize, String)>,
}

/// A fenced code block.
pub struct Block {
    /// The line of the opening fence.
    pub line: usize,
    /// The fence's info string (`sh`, `console`, `json`, or empty).
    pub info: String,
    /// Its lines, the fence's indentation taken off.
    pub lines: Vec<String>,
    /// The `<!-- doc-test … -->` comment right before it.
    pub test: Option<DocTest>,
}

impl Block {
    /// The line number of its `i`-th line.
    pub fn line_of(&self, i: usize) -> usize {
        self.line + 1 + i
    }
}

/// `<!-- doc-test WORD… [newline SETUP-LINE…] -->`: how the block after it is tested.
pub struct DocTest {
    pub line: usize,
    /// The header's words (`fakehost=blueprint`, `any=…`, `config`, …), quotes taken off.
    pub words: Vec<String>,
    /// The set-up lines, each with its line number.
    pub setup: Vec<(usize, String)>,
}

impl DocTest {
    /// The value of the first `key=value` word.
    pub fn get<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        self.all(key).next()
    }
    /// The values of every `key=value` word.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.words
            .iter()
            .filter_map(move |w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
}

/// A code span (`` `…` `` outside fenced blocks), line breaks inside it made spaces.
pub struct Span {
    pub line: usize,
    pub text: String,
    /// The paragraph's text right before it (for "config key `x`").
    pub before: String,
}

/// README.md and every Markdown file under docs/, relative to `root`, in a stable order.
pub fn all_docs(root: &Path) -> Vec<Doc> {
    let mut files = vec![root.join("README.md")];
    md_under(&root.join("docs"), &mut files);
    files.sort();
    files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let rel = f
                .strip_prefix(root)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned();
            parse(&rel, &text)
        })
        .collect()
}

fn md_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            md_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// Splits a comment's header into words; `"…"` keeps spaces in one word.
pub fn words(s: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut any) = (false, false);
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    v.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        v.push(cur);
    }
    v
}

pub fn parse(path: &str, text: &str) -> Doc {
    let lines: Vec<&str> = text.lines().collect();
    let mut doc = Doc {
        path: path.to_owned(),
        blocks: Vec::new(),
        spans: Vec::new(),
        anchors: Vec::new(),
        links: Vec::new(),
        prose: Vec::new(),
    };
    let mut pending: Option<DocTest> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            let indent = line.len() - t.len();
            let mut block = Block {
                line: i + 1,
                info: info.trim().to_owned(),
                lines: Vec::new(),
                test: pending.take(),
            };
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                let l = lines[i];
                let cut = l.len() - l.trim_start().len();
                block.lines.push(l[cut.min(indent)..].to_owned());
                i += 1;
            }
            doc.blocks.push(block);
            i += 1;
            continue;
        }
        if let Some(rest) = t.strip_prefix("<!-- doc-test") {
            let start = i + 1;
            let mut body = vec![rest.to_owned()];
            while !body.last().is_some_and(|l| l.contains("-->")) && i + 1 < lines.len() {
                i += 1;
                body.push(lines[i].to_owned());
            }
            let last = body.len() - 1;
            body[last] = body[last].split("-->").next().unwrap_or("").to_owned();
            let setup = body[1..]
                .iter()
                .enumerate()
                .map(|(k, l)| (start + 1 + k, l.trim().to_owned()))
                .filter(|(_, l)| !l.is_empty())
                .collect();
            pending = Some(DocTest {
                line: start,
                words: words(&body[0]),
                setup,
            });
            i += 1;
            continue;
        }
        if t.starts_with('|') && pending.is_some() {
            // A table after a doc-test comment is its block (and prose too).
            let mut block = Block {
                line: i,
                info: "table".into(),
                lines: Vec::new(),
                test: pending.take(),
            };
            while i < lines.len() && lines[i].trim_start().starts_with('|') {
                block.lines.push(lines[i].trim().to_owned());
                doc.prose.push((i + 1, lines[i].to_owned()));
                i += 1;
            }
            doc.blocks.push(block);
            continue;
        }
        if !t.is_empty() {
            // A doc-test comment belongs to the block right after it (blank lines between).
            pending = None;
        }
        if let Some(h) = t.strip_prefix('#') {
            if h.starts_with([' ', '#']) {
                doc.anchors.push(anchor(h.trim_start_matches('#').trim()));
            }
        }
        doc.prose.push((i + 1, line.to_owned()));
        i += 1;
    }
    let mut seen: Vec<String> = Vec::new();
    for a in &mut doc.anchors {
        let n = seen.iter().filter(|s| *s == a).count();
        seen.push(a.clone());
        if n > 0 {
            *a = format!("{a}-{n}");
        }
    }
    doc.spans = spans(&doc.prose);
    doc.links = links(&doc.prose);
    doc
}

/// GitHub's anchor of a heading: lower case, backticks and punctuation (but `-` and `_`)
/// dropped, spaces made `-`.
pub fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The code spans of the prose; one may run over a line break (within a paragraph).
fn spans(prose: &[(usize, String)]) -> Vec<Span> {
    let mut v = Vec::new();
    // An open span: its line, the run of backticks that closes it, its text, its `before`.
    let mut open: Option<(usize, usize, String, String)> = None;
    let mut last_line = 0;
    // The paragraph's text outside spans so far: what a span's `before` is cut from.
    let mut para = String::new();
    for (n, line) in prose {
        if *n != last_line + 1 || line.trim().is_empty() {
            open = None; // a paragraph ended (inside an unclosed span: not a span)
            para.clear();
        }
        last_line = *n;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '`' {
                match &mut open {
                    Some((_, _, text, _)) => text.push(c),
                    None => para.push(c),
                }
                continue;
            }
            let mut run = 1;
            while chars.peek() == Some(&'`') {
                chars.next();
                run += 1;
            }
            match open.take() {
                None => {
                    let tail: String = para
                        .chars()
                        .rev()
                        .take(40)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    open = Some((*n, run, String::new(), tail));
                }
                Some((line, want, text, before)) if want == run => {
                    // `` `x` `` keeps its inner backticks; one space each side is padding.
                    let text = if run > 1 {
                        text.trim().to_owned()
                    } else {
                        text
                    };
                    para.push_str(&text);
                    v.push(Span { line, text, before });
                }
                Some((line, want, mut text, before)) => {
                    text.push_str(&"`".repeat(run));
                    open = Some((line, want, text, before));
                }
            }
        }
        match &mut open {
            Some((_, _, text, _)) => text.push(' '),
            None => para.push(' '),
        }
    }
    v
}

/// Relative link targets (`[x](target)`, `[x]: target`), as written (with their `#anchor`).
fn links(prose: &[(usize, String)]) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    for (n, line) in prose {
        let mut rest = line.as_str();
        while let Some(p) = rest.find("](") {
            let after = &rest[p + 2..];
            let end = after.find(')').unwrap_or(after.len());
            v.push((
                *n,
                after[..end]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            ));
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some((_, target)) = t.split_once("]: ") {
                v.push((
                    *n,
                    target.split_whitespace().next().unwrap_or("").to_owned(),
                ));
            }
        }
    }
    v.retain(|(_, t)| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"));
    for (_, t) in &mut v {
        *t = t.trim_start_matches('<').trim_end_matches('>').to_owned();
    }
    v
}

#[test]
fn reads_blocks_spans_anchors_links() {
    let d = parse(
        "x.md",
        "# A `b` title\n\nSee `gpuhook\nlist` and [c](c.md#x-y), `` config `key` ``.\n\n<!-- doc-test fakehost=blueprint any=\"a b\"\ndomain d count=1\n-->\n```console\n$ gpuhook list\n```\n\n## Two\n## Two\n  ```sh\n  x\n  ```\n",
    );
    assert_eq!(d.anchors, ["a-b-title", "two", "two-1"]);
    assert_eq!(d.spans.len(), 3);
    assert_eq!(d.spans[2].text, "config `key`");
    assert_eq!(
        (d.spans[1].line, d.spans[1].text.as_str()),
        (3, "gpuhook list")
    );
    assert_eq!(d.links, [(4, "c.md#x-y".to_string())]);
    let t = d.blocks[0].test.as_ref().expect("doc-test");
    assert_eq!(t.words, ["fakehost=blueprint", "any=a b"]);
    assert_eq!(t.setup, [(7, "domain d count=1".to_string())]);
    assert_eq!((d.blocks[0].line, d.blocks[0].line_of(0)), (9, 10));
    assert_eq!(d.blocks[1].lines, ["x"]);
    assert!(d.blocks[1].test.is_none());
}
