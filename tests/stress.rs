//! Proof that a GPU is never given twice nor lost: many hook processes at once, processes
//! SIGKILLed at random points of state updates, and hostile environments (read-only or
//! full state directory). Each test prints its figures (run with `--nocapture`; they are
//! in docs/RELIABILITY.md).

mod common;
use common::*;
use gpuhook::reserve::state::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testbed::FakeHost;

fn spawn_hook(h: &Host, name: &str, op: &str, xml: &str) -> Child {
    let subop = if op == "release" { "end" } else { "begin" };
    let mut c = h
        .cmd()
        .args(["hook", name, op, subop, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let _ = c.stdin.take().expect("stdin").write_all(xml.as_bytes());
    c
}

fn spawn_list(h: &Host) -> Child {
    h.cmd()
        .args(["list", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("list")
}

/// The state parses, and no GPU is in two reservations. Returns domain → GPUs.
fn check_state(h: &Host) -> BTreeMap<String, Vec<String>> {
    let st = Store::new(&h.state)
        .read()
        .expect("state parses after every step");
    let mut seen = BTreeSet::new();
    let mut out = BTreeMap::new();
    for r in st.reservations.values() {
        for g in &r.gpus {
            assert!(seen.insert(*g), "GPU {g} is in two reservations");
        }
        out.insert(
            r.holder.name().to_string(),
            r.gpus.iter().map(|g| g.to_string()).collect(),
        );
    }
    out
}

#[test]
fn contention_rounds() {
    let h = Host::new(FakeHost::dgx8());
    let rounds = 10;
    let (mut fired, mut ok_total, mut lists) = (0, 0, 0);
    let mut holders: Vec<(String, String)> = Vec::new();
    let t0 = Instant::now();
    for round in 0..rounds {
        // Free the previous round's holders while 64 new domains prepare and lists read.
        let mut kids: Vec<(Option<String>, Child)> = Vec::new();
        for (name, xml) in holders.drain(..) {
            kids.push((None, spawn_hook(&h, &name, "release", &xml)));
        }
        let releases = kids.len();
        let mut xmls = BTreeMap::new();
        for i in 0..64u32 {
            let name = format!("r{round}d{i}");
            let xml = domain(
                &name,
                round * 1000 + i + 1,
                &gpus(if i % 8 == 7 { r#"count="2""# } else { "" }),
            );
            kids.push((Some(name.clone()), spawn_hook(&h, &name, "prepare", &xml)));
            xmls.insert(name, xml);
            if i % 4 == 0 {
                kids.push((None, spawn_list(&h)));
                lists += 1;
            }
        }
        fired += kids.len();
        let mut winners = Vec::new();
        for (name, k) in kids {
            let out = k.wait_with_output().expect("wait");
            if let Some(name) = name {
                if out.status.success() {
                    winners.push(name);
                } else {
                    let e = stderr(&out);
                    assert_eq!(e.lines().count(), 1, "{e}");
                    assert!(e.contains("cannot reserve"), "{e}");
                }
            } else {
                assert!(
                    out.status.success(),
                    "release/list failed: {}",
                    stderr(&out)
                );
            }
        }
        let held = check_state(&h);
        let n: usize = held.values().map(Vec::len).sum();
        assert!(n <= 8);
        for w in &winners {
            assert!(held.contains_key(w), "winner {w} lost its reservation");
        }
        assert_eq!(held.len(), winners.len(), "only winners hold GPUs");
        // Releases ran concurrently, so how many won depends on timing; once every
        // release is done, a request that fits must succeed and one that does not, fail.
        let free = 8 - n;
        let probe = domain("probe", 999_999, &gpus(&format!(r#"count="{}""#, free + 1)));
        assert_fails(
            &h.hook("probe", "prepare", &probe),
            "probe",
            "cannot reserve",
        );
        if free > 0 {
            let fits = domain("probe", 999_999, &gpus(&format!(r#"count="{free}""#)));
            assert_ok(&h.hook("probe", "prepare", &fits));
            assert_ok(&h.hook("probe", "release", &fits));
        }
        ok_total += winners.len();
        holders = winners
            .into_iter()
            .map(|w| (w.clone(), xmls[&w].clone()))
            .collect();
        eprintln!(
            "round {round}: {releases} releases, 64 prepares, {} winners, {n} GPUs held",
            holders.len()
        );
    }
    // From an empty host, exactly the satisfiable ones succeed.
    for (name, xml) in holders.drain(..) {
        assert_ok(&h.hook(&name, "release", &xml));
    }
    assert!(check_state(&h).is_empty());
    let kids: Vec<Child> = (0..64u32)
        .map(|i| {
            spawn_hook(
                &h,
                &format!("e{i}"),
                "prepare",
                &domain(&format!("e{i}"), 50_000 + i, &gpus("")),
            )
        })
        .collect();
    let ok = kids
        .into_iter()
        .filter(|_| true)
        .map(|k| k.wait_with_output().unwrap())
        .filter(|o| o.status.success())
        .count();
    assert_eq!(ok, 8, "exactly the 8 satisfiable prepares succeed");
    eprintln!(
        "contention: {} hook/list processes in {rounds} rounds + 64, {ok_total} reservations granted, {lists} concurrent lists, {:.1}s",
        fired + 64,
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn sigkill_during_updates() {
    let h = Host::new(FakeHost::wide(16));
    // 1,000 reservations of other domains: state writes take long enough to be hit.
    testbed::fakehost::fill_state(&h.state, 1000).unwrap();
    let bulk = Store::new(&h.state).read().unwrap();
    // Domains that hold GPUs throughout: none of them may ever be lost.
    for i in 0..4 {
        assert_ok(&h.hook(
            &format!("keep{i}"),
            "prepare",
            &domain(&format!("keep{i}"), 100 + i, &gpus(r#"count="2""#)),
        ));
    }
    let keep = check_state(&h);
    let lock_path = h.state.with_file_name("state.json.lock");
    let tmp_path = h.state.with_file_name(".state.json.tmp");
    let kills = 400;
    let (mut killed_mid_write, mut committed, mut not_committed) = (0, 0, 0);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let victim = domain("victim", 7, &gpus(r#"count="3""#));
    // Calibrate: how long one unkilled prepare + release takes here; kills then land
    // uniformly over 0..130% of that, so before, during and after the write.
    let t = Instant::now();
    for _ in 0..5 {
        assert_ok(&h.hook("victim", "prepare", &victim));
        assert_ok(&h.hook("victim", "release", &victim));
    }
    let span_us = (t.elapsed().as_micros() as u64 / 10).max(1) * 13 / 10;
    for i in 0..kills {
        let op = if i % 2 == 0 { "prepare" } else { "release" };
        let before = check_state(&h).contains_key("victim");
        // (No hook runs now: a temp file after the kill is this process's half-written one.)
        let _ = std::fs::remove_file(&tmp_path);
        let mut child = spawn_hook(&h, "victim", op, &victim);
        if i % 4 == 3 {
            // Every fourth kill aims at the write itself: as soon as the temp file shows.
            // (Random points alone hit a window of a few hundred µs in ~0.5 % of kills.)
            let t = Instant::now();
            while !tmp_path.exists()
                && t.elapsed() < Duration::from_secs(5)
                && matches!(child.try_wait(), Ok(None))
            {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(Duration::from_micros(rnd() % span_us));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
        if tmp_path.exists() {
            killed_mid_write += 1;
        }
        // Whole old or whole new version; nobody else's reservation touched.
        let now = check_state(&h);
        for (d, g) in &keep {
            assert_eq!(
                now.get(d),
                Some(g),
                "reservation of {d} lost after kill {i}"
            );
        }
        assert_eq!(
            now.len(),
            keep.len() + usize::from(now.contains_key("victim")),
            "keep holds the 1,000 bulk and 4 GPU reservations"
        );
        if let Some(g) = now.get("victim") {
            assert_eq!(g.len(), 3, "torn reservation");
        }
        if now.contains_key("victim") != before {
            committed += 1;
        } else {
            not_committed += 1;
        }
        // The lock died with the process.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&lock_path)
            .unwrap();
        // SAFETY: flock(2) on a descriptor of a file this loop holds open.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0, "lock still held after kill {i}");
        drop(f);
    }
    // A later good run cleans the leftover temp file and works.
    assert_ok(&h.hook("after", "prepare", &domain("after", 8, &gpus(""))));
    assert!(!tmp_path.exists());
    assert_eq!(bulk.reservations.len(), 1000);
    assert_eq!(
        Store::new(&h.state).read().unwrap().reservations.len(),
        keep.len() + 1 + usize::from(check_state(&h).contains_key("victim"))
    );
    eprintln!("sigkill: {kills} hook processes killed at random points (0-{span_us} us; a quarter as the temp file appears) of prepare/release on a 1,000-reservation state: {killed_mid_write} left a half-written temp file, {committed} had committed, {not_committed} had not; never torn, nothing lost, lock always free");
    assert!(
        killed_mid_write > 0,
        "no kill landed inside a write: the test proves less than it claims"
    );
}

#[test]
fn read_only_and_full_state_directory() {
    let h = Host::new(FakeHost::blueprint());
    let dir = h.state.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let mount = |opts: &str| {
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                opts,
                "gpuhook-test",
                dir.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "mount: {}", stderr(&o));
    };
    let umount = || {
        let _ = Command::new("umount").arg(&dir).status();
    };
    let xml = domain("g", 1, &gpus(""));
    let plain = "<domain><name>p</name><uuid>11111111-2222-4333-8444-555555555555</uuid></domain>";
    // Read-only: a clear error; non-GPU domains untouched; remount rw and it recovers.
    mount("ro,mode=0700,size=64k");
    let o = h.hook("g", "prepare", &xml);
    assert_fails(&o, "g", "Read-only file system");
    assert!(stderr(&o).contains(&dir.display().to_string()));
    assert_ok(&h.hook("p", "prepare", plain));
    let o = Command::new("mount")
        .args(["-o", "remount,rw", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_ok(&h.hook("g", "prepare", &xml));
    umount();
    // Full: the old state survives whole, the error names the cause, freeing space recovers.
    mount("mode=0700,size=8k");
    assert_ok(&h.hook("a", "prepare", &domain("a", 2, &gpus(""))));
    let before = std::fs::read(&h.state).unwrap();
    let filler = dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 64 * 1024]);
    let o = h.hook("b", "prepare", &domain("b", 3, &gpus("")));
    assert_fails(&o, "b", "No space left on device");
    assert_eq!(
        std::fs::read(&h.state).unwrap(),
        before,
        "a full disk never tears the state"
    );
    assert!(!h.state.with_file_name(".state.json.tmp").exists());
    assert_ok(&h.hook("p", "prepare", plain));
    std::fs::remove_file(&filler).unwrap();
    assert_ok(&h.hook("b", "prepare", &domain("b", 3, &gpus(""))));
    assert_eq!(check_state(&h).len(), 2);
    umount();
    // Missing directory: created 0700 by the first GPU start.
    std::fs::remove_dir_all(&dir).unwrap();
    assert_ok(&h.hook("g", "prepare", &xml));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

/// 8 sharers at once (real hook processes, prepare then release concurrently) for the slots
/// of shared GPUs: exactly as many win as there are slots, the losers are refused in one line
/// naming the sharers, no slot is given twice nor past `replicas`, and after all the releases
/// no reservation is left. Each layout twice: 1 GPU × 3 slots, 2 GPUs × 2 slots (one slot
/// each, then two slots each on distinct GPUs).
#[test]
fn concurrent_sharers() {
    let t0 = Instant::now();
    for (sharing, count, winners) in [
        (serde_json::json!({"0000:07:00.0": {"replicas": 3}}), 1, 3),
        (serde_json::json!({"10de:06de": {"replicas": 2}}), 1, 4),
        (serde_json::json!({"10de:06de": {"replicas": 2}}), 2, 2),
    ] {
        let h = Host::with(FakeHost::blueprint(), |c| c["sharing"] = sharing.clone());
        for round in 0..5u32 {
            let xmls: Vec<(String, String)> = (0..8u32)
                .map(|i| {
                    let name = format!("s{round}x{i}");
                    let attrs = format!(r#"share="yes" count="{count}""#);
                    let xml = domain(&name, 70_000 + round * 100 + i, &gpus(&attrs));
                    (name, xml)
                })
                .collect();
            let kids: Vec<(String, Child)> = xmls
                .iter()
                .map(|(n, x)| (n.clone(), spawn_hook(&h, n, "prepare", x)))
                .collect();
            let mut won = BTreeSet::new();
            for (name, k) in kids {
                let out = k.wait_with_output().expect("wait");
                if out.status.success() {
                    won.insert(name);
                } else {
                    let e = stderr(&out);
                    assert_eq!(e.lines().count(), 1, "{e}");
                    assert!(
                        e.starts_with(&format!(
                            "gpuhook: domain '{name}': cannot reserve {count} shared GPU slot"
                        )),
                        "{e}"
                    );
                    assert!(e.contains("slots taken by domain 's"), "{e}");
                }
            }
            assert_eq!(won.len(), winners, "{sharing} count {count}: {won:?}");
            let held = check_state(&h);
            assert_eq!(
                held.keys().cloned().collect::<BTreeSet<_>>(),
                won,
                "only the winners hold slots"
            );
            let replicas: u32 = sharing.as_object().unwrap().values().next().unwrap()["replicas"]
                .as_u64()
                .unwrap() as u32;
            let mut per_gpu: BTreeMap<String, usize> = BTreeMap::new();
            for (d, units) in &held {
                assert_eq!(units.len(), count as usize, "{d}: {units:?}");
                let pcis: BTreeSet<&str> =
                    units.iter().map(|u| u.split('/').next().unwrap()).collect();
                assert_eq!(pcis.len(), units.len(), "{d}: slots on distinct GPUs");
                for u in units {
                    let (pci, s) = u.split_once("/slot").unwrap_or_else(|| panic!("{u}"));
                    assert!(s.parse::<u32>().unwrap() < replicas, "{u}");
                    *per_gpu.entry(pci.into()).or_default() += 1;
                }
            }
            assert!(
                per_gpu.values().all(|n| *n as u32 == replicas),
                "every slot used once: {per_gpu:?}"
            );
            assert_eq!(h.holders().len(), winners, "list agrees");
            let kids: Vec<Child> = xmls
                .iter()
                .map(|(n, x)| spawn_hook(&h, n, "release", x))
                .collect();
            for k in kids {
                let out = k.wait_with_output().expect("wait");
                assert!(out.status.success(), "release: {}", stderr(&out));
            }
            assert!(check_state(&h).is_empty(), "all freed");
        }
    }
    eprintln!(
        "concurrent sharers: 3 layouts x 5 rounds of 8 prepares + 8 releases, {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}
