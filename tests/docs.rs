//! The docs under test: README.md and every Markdown file under docs/ read against the code
//! (`docs/guides/testing.md`, "The docs under test"). Each failure is one line naming the
//! doc, the line and the difference.

#[path = "docs/bed.rs"]
mod bed;
#[path = "docs/commands.rs"]
mod commands;
#[path = "docs/markdown.rs"]
mod markdown;
#[path = "docs/run.rs"]
mod run;

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fails with every finding, one line each, after saying what was covered.
fn verdict(what: &str, covered: String, findings: Vec<String>) {
    eprintln!("docs: {what}: {covered}");
    assert!(
        findings.is_empty(),
        "{} finding(s):\n{}",
        findings.len(),
        findings.join("\n")
    );
}

/// Every command line the docs show names real subcommands, flags and values.
#[test]
fn command_lines_name_real_flags() {
    let (mut n, mut flags, mut findings) = (0, 0, Vec::new());
    for doc in markdown::all_docs(root()) {
        for l in commands::lines(&doc) {
            n += 1;
            if std::env::var_os("DOCS_SHOW").is_some() {
                eprintln!("{}:{}: {}", doc.path, l.line, l.words.join(" "));
            }
            flags += l.words.iter().filter(|w| w.starts_with('-') && w.len() > 1).count();
            for e in commands::check(&l) {
                findings.push(format!("{}:{}: {e}", doc.path, l.line));
            }
        }
    }
    verdict("command lines", format!("{n} lines, {flags} flags checked"), findings);
}

/// A synopsis block (`<!-- doc-test synopsis=PROGRAM -->`) names every subcommand and flag.
#[test]
fn synopses_are_complete() {
    let (mut n, mut findings) = (0, Vec::new());
    for doc in markdown::all_docs(root()) {
        for b in &doc.blocks {
            let Some(p) = b.test.as_ref().and_then(|t| t.get("synopsis")) else {
                continue;
            };
            n += 1;
            let one = markdown::Doc {
                path: doc.path.clone(),
                blocks: vec![markdown::Block {
                    line: b.line,
                    info: b.info.clone(),
                    lines: b.lines.clone(),
                    test: None,
                }],
                spans: Vec::new(),
                anchors: Vec::new(),
                links: Vec::new(),
                prose: Vec::new(),
            };
            for gap in commands::synopsis_gaps(p, &commands::lines(&one)) {
                findings.push(format!("{}:{}: the synopsis of {p} lacks {gap}", doc.path, b.line));
            }
        }
    }
    verdict("synopses", format!("{n} synopsis blocks"), findings);
}

/// Every block marked `<!-- doc-test fakehost=PROFILE -->` runs on that fake host and prints
/// what it quotes.
#[test]
fn tested_blocks_print_what_they_quote() {
    let (mut blocks, mut commands, mut findings) = (0, 0, Vec::new());
    let t0 = std::time::Instant::now();
    for doc in markdown::all_docs(root()) {
        for b in &doc.blocks {
            let Some(t) = b.test.as_ref().filter(|t| t.get("fakehost").is_some()) else {
                continue;
            };
            blocks += 1;
            match run::run(&doc.path, b, t) {
                Ok(n) => commands += n,
                Err(e) => findings.extend(e),
            }
        }
    }
    verdict(
        "tested blocks",
        format!("{blocks} blocks run on fake hosts, {commands} transcript commands, in {:.1} s", t0.elapsed().as_secs_f64()),
        findings,
    );
}
