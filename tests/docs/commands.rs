//! The command lines the docs show (`gpuhook …`, `gpuhook-libvirt …`, `gpuhook-testbed
//! fakehost …`), in fenced blocks and code spans, checked against the programs' own
//! definitions: each subcommand exists, each flag is one that command (or a global one above
//! it) takes, each literal value of a flag with fixed values is one of them. The synopsis
//! blocks (`doc-test synopsis=PROGRAM`) must name every subcommand and every flag.

use super::markdown::Doc;
use clap::CommandFactory;
use std::collections::BTreeSet;

/// A program the docs name whose command line is checked.
pub fn program(word: &str) -> Option<clap::Command> {
    let mut c = match name(word)? {
        "gpuhook" => gpuhook::doors::cli::Cli::command(),
        "gpuhook-libvirt" => gpuhook::doors::cli::LibvirtCli::command(),
        _ => return None,
    };
    c.build();
    Some(c)
}

/// The program a command's first word runs: its name, or a path to it in a `bin/` or
/// `target/` directory (`/usr/bin/gpuhook`, `./target/release/gpuhook`; not `/etc/gpuhook`).
pub fn name(word: &str) -> Option<&str> {
    let (dir, name) = word.rsplit_once('/').unwrap_or(("", word));
    let runnable = dir.is_empty() || dir.ends_with("/bin") || dir.contains("target/");
    runnable.then_some(name)
}

/// One command line the docs show: where, and its words from the program's name on.
pub struct Line {
    pub line: usize,
    pub words: Vec<String>,
}

/// The command lines of a doc: every line of a fenced block that is not JSON, XML or YAML
/// (a `$ ` prompt, `sudo` and `VAR=value` taken off; `\` continuations and a synopsis' indented
/// continuations joined; `# comments` and a synopsis' description after two spaces cut), and
/// every code span; each split into the commands of a pipeline or list (`|`, `&&`, `;`).
pub fn lines(doc: &Doc) -> Vec<Line> {
    let mut raw: Vec<(usize, String)> = Vec::new();
    for b in &doc.blocks {
        if ["json", "xml", "yaml", "toml"].contains(&b.info.as_str()) {
            continue;
        }
        let synopsis = b.info.is_empty();
        let mut cur: Option<(usize, String)> = None;
        for (i, l) in b.lines.iter().enumerate() {
            let n = b.line_of(i);
            let t = l.trim();
            let continued = cur.as_ref().is_some_and(|(_, c)| c.ends_with('\\'))
                || (synopsis
                    && cur.is_some()
                    && l.starts_with(' ')
                    && (t.starts_with('[') || t.starts_with('(') || t.starts_with('-')));
            if continued {
                let (_, c) = cur.as_mut().expect("cur");
                *c = format!(
                    "{} {}",
                    c.trim_end_matches('\\').trim_end(),
                    cut(t, synopsis)
                );
                continue;
            }
            raw.extend(cur.take());
            let t = t.strip_prefix("$ ").unwrap_or(t);
            cur = Some((n, cut(t, synopsis).to_owned()));
        }
        raw.extend(cur);
    }
    // Spans, but a manual page's name (`gpuhook(1)`).
    let man = |t: &str| t.ends_with(')') && t.contains('(') && !t.contains(' ');
    raw.extend(
        doc.spans
            .iter()
            .filter(|s| !man(&s.text))
            .map(|s| (s.line, s.text.clone())),
    );
    let mut v = Vec::new();
    for (n, text) in raw {
        for seg in segments(&text) {
            let mut w = tokens(&seg);
            while w
                .first()
                .is_some_and(|x| x == "sudo" || (x.contains('=') && !x.starts_with('-')))
            {
                w.remove(0);
            }
            if w.first()
                .is_some_and(|x| program(x).is_some() || name(x) == Some("gpuhook-testbed"))
            {
                v.push(Line { line: n, words: w });
            }
        }
    }
    v
}

/// A line cut at its `# comment`, and a synopsis line at its description (two spaces on).
fn cut(t: &str, synopsis: bool) -> &str {
    let t = match t.find(" #") {
        Some(p) => &t[..p],
        None => t,
    };
    match (synopsis, t.find("  ")) {
        (true, Some(p)) => &t[..p],
        _ => t,
    }
}

/// The commands of a pipeline or list, outside quotes and brackets.
fn segments(s: &str) -> Vec<String> {
    let mut v = vec![String::new()];
    let (mut depth, mut quote) = (0i32, None::<char>);
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[' | '(' | '{') => depth += 1,
            (None, ']' | ')' | '}') => depth -= 1,
            (None, '|' | ';' | '&') if depth <= 0 => {
                let prev_space = i == 0 || chars[i - 1] == ' ';
                let next_space = i + 1 >= chars.len() || matches!(chars[i + 1], ' ' | '|' | '&');
                if c == ';' || (prev_space && next_space) {
                    if matches!(chars.get(i + 1), Some('|' | '&')) {
                        i += 1;
                    }
                    v.push(String::new());
                    i += 1;
                    continue;
                }
            }
            _ => {}
        }
        v.last_mut().expect("segment").push(c);
        i += 1;
    }
    v.into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A command's words: quotes taken off, brackets and parentheses of a synopsis dropped,
/// alternatives (`--mig|--share`, `-c/--config`) split, redirections dropped.
fn tokens(s: &str) -> Vec<String> {
    let mut v = Vec::new();
    for w in super::markdown::words(&s.replace(['[', ']', '(', ')'], " ")) {
        if w.starts_with(['<', '>']) || w.starts_with("2>") {
            continue;
        }
        let w = w.replace("…", "");
        let alts: Vec<&str> = if w.starts_with('-') {
            w.split(['|', '/']).collect()
        } else {
            vec![w.as_str()]
        };
        v.extend(
            alts.into_iter()
                .filter(|a| !a.is_empty())
                .map(str::to_owned),
        );
    }
    v
}

/// A word that stands for something (`NAME`, `PCI|UUID`, `FILE|-`, `<domain>`): not a literal.
fn placeholder(w: &str) -> bool {
    w.chars().all(|c| !c.is_lowercase()) || w.starts_with('<') || w.contains('…')
}

/// The manual pages the packages install (`xtask dist`): one per program and one per visible
/// subcommand, as file names (`gpuhook-health-reset.1.gz`).
pub fn man_pages() -> Vec<String> {
    fn walk(cmd: &clap::Command, name: &str, out: &mut Vec<String>) {
        out.push(format!("{name}.1.gz"));
        for s in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            walk(s, &format!("{name}-{}", s.get_name()), out);
        }
    }
    let mut v = vec!["gpuhook-runtime.1.gz".to_owned()];
    for p in ["gpuhook", "gpuhook-libvirt"] {
        walk(&program(p).expect("program"), p, &mut v);
    }
    v
}

/// The command lines a text quotes (`'gpuhook …'`, `` `gpuhook …` ``): a help text, a message.
pub fn quoted(text: &str) -> Vec<Line> {
    let mut v = Vec::new();
    for q in ['\'', '`'] {
        for (k, piece) in text.split(q).enumerate() {
            let w = tokens(piece);
            if k % 2 == 1 && w.len() > 1 && program(&w[0]).is_some() {
                v.push(Line { line: 0, words: w });
            }
        }
    }
    v
}

/// Every help text of a program: each command's about, long about and after-help, each
/// argument's help.
pub fn help_texts(cmd: &clap::Command, out: &mut Vec<(String, String)>) {
    let name = cmd.get_name().to_owned();
    for t in [
        cmd.get_about(),
        cmd.get_long_about(),
        cmd.get_after_help(),
        cmd.get_after_long_help(),
        cmd.get_before_help(),
    ]
    .into_iter()
    .flatten()
    {
        out.push((name.clone(), t.to_string()));
    }
    for a in cmd.get_arguments() {
        for t in [a.get_help(), a.get_long_help()].into_iter().flatten() {
            out.push((format!("{name} {}", a.get_id()), t.to_string()));
        }
    }
    for s in cmd.get_subcommands() {
        help_texts(s, out);
    }
}

/// What is wrong with one command line, if anything.
pub fn check(l: &Line) -> Vec<String> {
    let first = &l.words[0];
    if name(first) == Some("gpuhook-testbed") {
        return testbed_line(&l.words);
    }
    let root = program(first).expect("a program");
    let mut path: Vec<&clap::Command> = vec![&root];
    let mut errs = Vec::new();
    let mut words = l.words[1..].iter().peekable();
    while let Some(w) = words.next() {
        let cmd = *path.last().expect("path");
        if w == "--" || foreign_rest(cmd) {
            break;
        }
        if w.starts_with('-') && w.len() > 1 && !w[1..].starts_with(|c: char| c.is_ascii_digit()) {
            let (flag, inline) = match w.split_once('=') {
                Some((f, v)) => (f, Some(v.to_owned())),
                None => (w.as_str(), None),
            };
            let Some(arg) = find_arg(&path, flag) else {
                errs.push(format!("`{}` has no flag {flag}", shown(&path)));
                continue;
            };
            if arg.get_action().takes_values() {
                let value =
                    inline.or_else(|| words.next_if(|n| !n.starts_with('-') || *n == "-").cloned());
                if let Some(v) = value {
                    errs.extend(bad_value(&path, flag, arg, &v));
                }
            }
            continue;
        }
        if cmd.has_subcommands() && !cmd.is_allow_external_subcommands_set() {
            if placeholder(w) {
                break; // `gpuhook COMMAND …`: nothing more to check
            }
            if w.contains('/') {
                // `gpuhook list/check/release`: several subcommands named at once.
                let bad: Vec<&str> = w
                    .split('/')
                    .filter(|p| cmd.find_subcommand(p).is_none())
                    .collect();
                if !bad.is_empty() {
                    errs.push(format!(
                        "`{}` has no subcommand {}",
                        shown(&path),
                        bad.join(", ")
                    ));
                }
                break;
            }
            match cmd.find_subcommand(w) {
                Some(sub) => path.push(sub),
                None => {
                    errs.push(format!("`{}` has no subcommand {w}", shown(&path)));
                    break;
                }
            }
            continue;
        }
    }
    errs
}

/// A command whose only positional takes everything after it (`gpuhook runtime ARGS…`,
/// `cdi-hook …`): the rest of the line is another program's.
fn foreign_rest(cmd: &clap::Command) -> bool {
    let mut p = cmd.get_positionals();
    matches!((p.next(), p.next()), (Some(a), None) if a.is_trailing_var_arg_set())
}

fn shown(path: &[&clap::Command]) -> String {
    path.iter()
        .map(|c| c.get_name())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The argument `flag` names on this command, or a global one of a command above it.
fn find_arg<'a>(path: &[&'a clap::Command], flag: &str) -> Option<&'a clap::Arg> {
    let cmd = *path.last()?;
    let matches = |a: &&clap::Arg| match flag.strip_prefix("--") {
        Some(long) => {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|al| al.contains(&long))
        }
        None => flag.len() == 2 && a.get_short() == flag.chars().nth(1),
    };
    if let Some(a) = cmd.get_arguments().find(matches) {
        return Some(a);
    }
    if matches!(flag, "--help" | "-h") || (path.len() == 1 && matches!(flag, "--version" | "-V")) {
        return path[0].get_arguments().find(matches).or(Some(help_arg()));
    }
    path.iter().rev().skip(1).find_map(|c| {
        c.get_arguments()
            .filter(|a| a.is_global_set())
            .find(matches)
    })
}

fn help_arg() -> &'static clap::Arg {
    static HELP: std::sync::OnceLock<clap::Arg> = std::sync::OnceLock::new();
    HELP.get_or_init(|| {
        clap::Arg::new("help")
            .long("help")
            .action(clap::ArgAction::Help)
    })
}

/// A literal value the flag does not take (`--driver hots`); placeholders and lists of
/// alternatives written as a synopsis writes them (`none|cdi|host`) are read piece by piece.
fn bad_value(path: &[&clap::Command], flag: &str, arg: &clap::Arg, value: &str) -> Vec<String> {
    let known: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|p| p.get_name().to_owned())
        .collect();
    if known.is_empty() || placeholder(value) {
        return Vec::new();
    }
    value
        .split('|')
        .filter(|v| !v.is_empty() && !placeholder(v) && !known.iter().any(|k| k == v))
        .map(|v| {
            format!(
                "`{} {flag}` takes no value {v} (only {})",
                shown(path),
                known.join(", ")
            )
        })
        .collect()
}

/// `gpuhook-testbed fakehost PROFILE DIR`: the profile is one the test bed makes.
fn testbed_line(words: &[String]) -> Vec<String> {
    match words.get(1).map(String::as_str) {
        Some("fakehost") => match words.get(2) {
            Some(p) if !placeholder(p) && testbed::profile(p).is_none() => {
                vec![format!("`gpuhook-testbed fakehost` has no profile {p}")]
            }
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// What a synopsis block of `program` leaves out: each visible subcommand that has no line of
/// its own, each flag of it not named on one of its lines, each global flag named nowhere.
pub fn synopsis_gaps(program_name: &str, lines: &[Line]) -> Vec<String> {
    let root = program(program_name).expect("a program");
    let mut named: BTreeSet<(String, String)> = BTreeSet::new();
    let mut anywhere: BTreeSet<String> = BTreeSet::new();
    for l in lines
        .iter()
        .filter(|l| name(&l.words[0]) == Some(program_name))
    {
        let (mut cmd, mut path) = (&root, String::new());
        for w in &l.words[1..] {
            if w.starts_with('-') {
                let f = w.split('=').next().unwrap_or(w).to_owned();
                anywhere.insert(f.clone());
                named.insert((path.clone(), f));
            } else if let Some(s) = cmd.find_subcommand(w).filter(|_| cmd.has_subcommands()) {
                cmd = s;
                path = format!("{path} {w}").trim().to_owned();
                named.insert((path.clone(), String::new()));
            }
        }
    }
    let mut gaps = Vec::new();
    let mut leaves = Vec::new();
    leaves_of(&root, String::new(), &mut leaves);
    for (path, cmd) in &leaves {
        if !path.is_empty() && !named.contains(&(path.clone(), String::new())) {
            gaps.push(format!("`{program_name} {path}`"));
            continue;
        }
        for a in cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_positional())
        {
            let Some(long) = a.get_long() else { continue };
            let flag = format!("--{long}");
            if a.is_global_set() || ["--help", "--version"].contains(&flag.as_str()) {
                if !anywhere.contains(&flag)
                    && !a
                        .get_short()
                        .is_some_and(|s| anywhere.contains(&format!("-{s}")))
                {
                    gaps.push(format!("`{program_name} {flag}`"));
                }
            } else if !named.contains(&(path.clone(), flag.clone())) {
                gaps.push(format!("`{program_name} {path} {flag}`"));
            }
        }
    }
    gaps.sort();
    gaps.dedup();
    gaps
}

/// Each visible command without subcommands, by its path of names; the program itself too.
fn leaves_of<'a>(cmd: &'a clap::Command, path: String, out: &mut Vec<(String, &'a clap::Command)>) {
    if path.is_empty() {
        out.push((String::new(), cmd));
    }
    for s in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let p = format!("{path} {}", s.get_name()).trim().to_owned();
        if s.has_subcommands() {
            leaves_of(s, p, out);
        } else {
            out.push((p, s));
        }
    }
}

#[test]
fn reads_and_checks_command_lines() {
    let d = super::markdown::parse(
        "x.md",
        "```\ngpuhook attach NAME [--count N] [--mig|--share]\n               [--driver none|cdi|host]\n                               more\n```\n```sh\n$ sudo gpuhook -c F list --jsn   # x\nvirsh dumpxml a | gpuhook check -\n```\nand `gpuhook health reset PCI`, `gpuhook-libvirt request d --driver hots`, `gpuhook bogus`.\n",
    );
    let ls = lines(&d);
    let shown: Vec<String> = ls
        .iter()
        .map(|l| format!("{}:{}", l.line, l.words.join(" ")))
        .collect();
    assert_eq!(
        shown,
        [
            "2:gpuhook attach NAME --count N --mig --share --driver none|cdi|host",
            "7:gpuhook -c F list --jsn",
            "8:gpuhook check -",
            "10:gpuhook health reset PCI",
            "10:gpuhook-libvirt request d --driver hots",
            "10:gpuhook bogus",
        ]
    );
    let errs: Vec<Vec<String>> = ls.iter().map(check).collect();
    assert!(errs[0].is_empty(), "{:?}", errs[0]);
    assert_eq!(errs[1], ["`gpuhook list` has no flag --jsn"]);
    assert!(errs[2].is_empty() && errs[3].is_empty());
    assert_eq!(
        errs[4],
        ["`gpuhook-libvirt request --driver` takes no value hots (only none, cdi, host)"]
    );
    assert_eq!(errs[5], ["`gpuhook` has no subcommand bogus"]);
}
